package sim

import (
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/meridian-router/meridian/sim/trace"
)

// Request is one inference request as the pod model sees it: token counts,
// not text. The live server derives one from an OpenAI request body; the
// replay tool builds one from a trace record.
type Request struct {
	// ID names the request in outcomes and logs. It need not be unique.
	ID string
	// PromptTokens is the prompt length in tokens; at least 1.
	PromptTokens int
	// OutputTokens is how many tokens the request generates before it
	// stops; at least 1.
	OutputTokens int
	// PrefixHashes identify the prompt's prefix blocks in order: equal
	// hashes mean an identical prompt up to and including that block, as in
	// vLLM's chained block hashes and Mooncake's hash_ids. May be empty
	// (then nothing is cached for this request).
	PrefixHashes []uint64
	// HashBlockTokens is how many prompt tokens each PrefixHashes entry
	// covers: 512 for the Mooncake trace, the pod's block size for live
	// pods. It must be a multiple of the pod's block size when PrefixHashes
	// is set.
	HashBlockTokens int
	// Adapter is the LoRA adapter the request runs with; "" for the base
	// model.
	Adapter string
}

// Outcome is what happened to one request. Times are on the clock the pod
// was driven with (virtual time for Engine, time since start for live pods).
type Outcome struct {
	Request *Request
	// Pod is the name of the pod that served (or refused) the request.
	Pod string
	// Arrival is when the request reached the pod.
	Arrival time.Duration
	// FirstToken is when the first output token was produced; negative if
	// none was.
	FirstToken time.Duration
	// Finish is when the request completed or failed.
	Finish time.Duration
	// CachedTokens is how many prompt tokens the prefix cache supplied when
	// the request was first scheduled.
	CachedTokens int
	// OutputTokens is how many tokens were generated (equal to
	// Request.OutputTokens on success).
	OutputTokens int
	// Preemptions counts how often the request was preempted and its KV
	// cache recomputed.
	Preemptions int
	// Err is nil on success; otherwise it wraps one of the Err* reasons.
	Err error
}

// TTFT is the time from arrival to the first token, or -1 if no token was
// produced.
func (o *Outcome) TTFT() time.Duration {
	if o.FirstToken < 0 {
		return -1
	}
	return o.FirstToken - o.Arrival
}

// Reasons a request fails. Outcome.Err wraps exactly one of them; classify
// with errors.Is.
var (
	// ErrServerError is an injected 5xx (Faults.ErrorRate).
	ErrServerError = errors.New("injected server error")
	// ErrRateLimited is an injected 429 (Faults.RejectRate).
	ErrRateLimited = errors.New("injected rate limit")
	// ErrCrashed is a stream cut by Faults.CrashAfterTokens.
	ErrCrashed = errors.New("pod crashed mid-stream")
	// ErrContextLength is a request longer than the profile's MaxModelLen
	// or than the whole KV cache.
	ErrContextLength = errors.New("request exceeds the model's context length")
	// ErrUnknownAdapter is a request for an adapter the pod does not serve.
	ErrUnknownAdapter = errors.New("unknown LoRA adapter")
	// ErrCancelled is a request withdrawn by its caller (a client that
	// disconnected from a live pod).
	ErrCancelled = errors.New("request cancelled")
	// ErrUnfinished is a request still in a pod when the virtual run ended,
	// e.g. on a hung pod.
	ErrUnfinished = errors.New("request unfinished when the run ended")
	// ErrInvalidRequest is a request with impossible token counts or hashes.
	ErrInvalidRequest = errors.New("invalid request")
)

// Faults are failures injected into a pod. The zero value injects nothing.
// They apply on both clocks: the virtual engine draws them from the pod's
// seeded random source, so a faulty virtual run stays deterministic.
type Faults struct {
	// ErrorRate is the fraction of arriving requests refused with a server
	// error (HTTP 500), in [0, 1].
	ErrorRate float64 `json:"errorRate,omitempty"`
	// RejectRate is the fraction of arriving requests refused as rate
	// limited (HTTP 429 with Retry-After), in [0, 1].
	RejectRate float64 `json:"rejectRate,omitempty"`
	// SlowFactor multiplies every step's duration; 0 and 1 mean normal
	// speed, 3 means a pod three times slower.
	SlowFactor float64 `json:"slowFactor,omitempty"`
	// Hang stops the engine: requests are accepted but make no progress
	// until Hang is cleared.
	Hang bool `json:"hang,omitempty"`
	// CrashAfterTokens fails each request once it has produced this many
	// output tokens (a live stream is cut without its final chunk); 0
	// means never.
	CrashAfterTokens int `json:"crashAfterTokens,omitempty"`
}

// Validate reports an out-of-range field.
func (f *Faults) Validate() error {
	switch {
	case f.ErrorRate < 0 || f.ErrorRate > 1:
		return fmt.Errorf("faults: errorRate %v outside [0, 1]", f.ErrorRate)
	case f.RejectRate < 0 || f.RejectRate > 1:
		return fmt.Errorf("faults: rejectRate %v outside [0, 1]", f.RejectRate)
	case f.ErrorRate+f.RejectRate > 1:
		return fmt.Errorf("faults: errorRate + rejectRate = %v exceeds 1", f.ErrorRate+f.RejectRate)
	case f.SlowFactor < 0:
		return fmt.Errorf("faults: slowFactor %v is negative", f.SlowFactor)
	case f.CrashAfterTokens < 0:
		return fmt.Errorf("faults: crashAfterTokens %d is negative", f.CrashAfterTokens)
	}
	return nil
}

// TraceRequest turns a trace record into a Request: Mooncake hash ids
// become prefix blocks of trace.MooncakeBlockTokens tokens. The ID is the
// record's line number.
func TraceRequest(r trace.Record) *Request {
	req := &Request{
		ID:           strconv.Itoa(r.Line),
		PromptTokens: r.InputTokens,
		OutputTokens: r.OutputTokens,
		PrefixHashes: r.HashIDs,
	}
	if len(r.HashIDs) > 0 {
		req.HashBlockTokens = trace.MooncakeBlockTokens
	}
	return req
}

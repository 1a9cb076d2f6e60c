package regions

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"slices"
	"time"
)

// Digest summarises one pool of one cluster: what Tier-1 reports on its
// pool-health feed (api/tier1/v1 PoolDigest) and what Tier-2 instances
// gossip to each other. Fractions are in [0, 1].
type Digest struct {
	Region  string
	Cluster string
	// Pool is the scheduler's name; Model the model it serves (its
	// modelName) and Adapters the LoRA adapters it can serve. A request
	// for Model or any of Adapters may go to this pool.
	Pool     string
	Model    string
	Adapters []string

	ReadyPods  int
	TotalPods  int
	QueueTotal int // waiting requests summed over ready pods
	QueueMax   int
	QueueMin   int
	KVMean     float64 // KV-cache use, mean over ready pods
	KVMax      float64
	Running    int
	InFlight   int // dispatched by Tier-1 and not finished
	TTFTP50    time.Duration
	TTFTP99    time.Duration
	// ErrorRate is the share of recent requests that failed (5xx, connect
	// errors) as Tier-1 saw them.
	ErrorRate float64
	// HotAdapters are the adapters with the most recent traffic, hottest
	// first.
	HotAdapters []string
	// Headroom is 1 for an idle pool and 0 for a saturated one.
	Headroom       float64
	PrefixHitRatio float64
	// Saturation is the pool's priority saturation as Tier-1 computed it
	// (priority.Saturation.Value: mean over fresh pods of the larger of
	// queue and KV use against their thresholds; 1 or more is saturated,
	// not clamped). FreshPods and StalePods count the pods whose metrics
	// were and were not believed in it; FreshPods 0 means unknown.
	Saturation           float64
	FreshPods, StalePods int
	// GateWaiting is the requests waiting in Tier-1's admission Gate for
	// the pool: taken in by the cluster but not yet let into the pool, so
	// not in Saturation. Tier-2 counts them as load (see
	// priority.Saturation.Backlog). AdmitRate is the requests per second
	// that Gate let into the pool lately, GateMaxQueued the most it holds
	// waiting (0: not reported).
	GateWaiting   int
	AdmitRate     float64
	GateMaxQueued int

	// Definition is the pool's definition as its Tier-1 applies it
	// (config.PoolDefinition: "field=hash" entries, sorted); empty from a
	// Tier-1 that does not report it. Pools of one model whose
	// definitions differ have drifted (Drift).
	Definition []string
	// ServedAdapters are the LoRA adapters some ready pod can serve, and
	// MaxModelLen the longest request (prompt plus output tokens) one of
	// them accepts, from the pods' /v1/models. MaxModelLen 0 means the
	// pods did not say: nothing is known of what they serve.
	ServedAdapters []string
	MaxModelLen    int
	// ServedModels are the base models the ready pods serve: "name", or
	// "name@root" where a pod says what it loaded (a path or repository).
	ServedModels []string

	// Version orders digests of one pool from one producer; Produced is
	// when the producer computed it, on its clock. Digests order by
	// (Produced, Version): several Tier-1 replicas of one cluster each
	// count their own Version, and their clocks agree far better than the
	// digest age bound.
	Version  uint64
	Produced time.Time
}

// Key identifies the pool a Digest describes.
type Key struct {
	Region, Cluster, Pool string
}

func (k Key) String() string { return k.Region + "/" + k.Cluster + "/" + k.Pool }

// Key returns the digest's key.
func (d *Digest) Key() Key { return Key{d.Region, d.Cluster, d.Pool} }

// newer reports whether d supersedes o.
func (d *Digest) newer(o *Digest) bool {
	if !d.Produced.Equal(o.Produced) {
		return d.Produced.After(o.Produced)
	}
	return d.Version > o.Version
}

// Limits on a digest's contents, so one fits a gossip packet and a
// malicious peer cannot make a node hold much.
const (
	maxNameLen     = 128
	maxAdapters    = 64
	maxHotAdapters = 16
	maxSaturation  = 1000
	maxAdmitRate   = 10_000_000 // requests per second
	maxDefinition  = 16         // fields of a definition
	maxEntryLen    = 64         // bytes of one "field=hash" entry
	maxServedLen   = 256        // bytes of one served model
)

// ErrInvalidDigest is wrapped by every validation and decoding error.
var ErrInvalidDigest = errors.New("regions: invalid digest")

// Validate reports the first problem with d.
func (d *Digest) Validate() error {
	bad := func(format string, args ...any) error {
		return fmt.Errorf("%w: %s: %s", ErrInvalidDigest, d.Key(), fmt.Sprintf(format, args...))
	}
	for _, f := range []struct{ name, v string }{{"region", d.Region}, {"cluster", d.Cluster}, {"pool", d.Pool}, {"model", d.Model}} {
		if f.v == "" {
			return bad("%s is empty", f.name)
		}
		if len(f.v) > maxNameLen {
			return bad("%s is %d bytes, at most %d", f.name, len(f.v), maxNameLen)
		}
	}
	if len(d.Adapters) > maxAdapters {
		return bad("%d adapters, at most %d", len(d.Adapters), maxAdapters)
	}
	if len(d.HotAdapters) > maxHotAdapters {
		return bad("%d hot adapters, at most %d", len(d.HotAdapters), maxHotAdapters)
	}
	if len(d.ServedAdapters) > maxAdapters {
		return bad("%d served adapters, at most %d", len(d.ServedAdapters), maxAdapters)
	}
	if len(d.ServedModels) > maxAdapters {
		return bad("%d served models, at most %d", len(d.ServedModels), maxAdapters)
	}
	for _, m := range d.ServedModels {
		if m == "" || len(m) > maxServedLen {
			return bad("served model %.20q: want 1 to %d bytes", m, maxServedLen)
		}
	}
	if len(d.Definition) > maxDefinition {
		return bad("%d definition fields, at most %d", len(d.Definition), maxDefinition)
	}
	for _, e := range d.Definition {
		if e == "" || len(e) > maxEntryLen {
			return bad("definition entry %.20q: want 1 to %d bytes", e, maxEntryLen)
		}
	}
	for _, a := range slices.Concat(d.Adapters, d.HotAdapters, d.ServedAdapters) {
		if a == "" || len(a) > maxNameLen {
			return bad("adapter name %.20q: want 1 to %d bytes", a, maxNameLen)
		}
	}
	for _, f := range []struct {
		name string
		v    int
	}{{"readyPods", d.ReadyPods}, {"totalPods", d.TotalPods}, {"queueTotal", d.QueueTotal}, {"queueMax", d.QueueMax},
		{"queueMin", d.QueueMin}, {"running", d.Running}, {"inFlight", d.InFlight},
		{"freshPods", d.FreshPods}, {"stalePods", d.StalePods}, {"gateWaiting", d.GateWaiting}, {"gateMaxQueued", d.GateMaxQueued}, {"maxModelLen", d.MaxModelLen}} {
		if f.v < 0 || f.v > math.MaxInt32 {
			return bad("%s %d out of range", f.name, f.v)
		}
	}
	for _, f := range []struct {
		name string
		v    float64
	}{{"kvMean", d.KVMean}, {"kvMax", d.KVMax}, {"errorRate", d.ErrorRate}, {"headroom", d.Headroom}, {"prefixHitRatio", d.PrefixHitRatio}} {
		if !(f.v >= 0 && f.v <= 1) { // also rejects NaN
			return bad("%s %v: want a fraction in [0, 1]", f.name, f.v)
		}
	}
	if !(d.AdmitRate >= 0 && d.AdmitRate <= maxAdmitRate) {
		return bad("admit rate %v: want 0 to %d requests per second", d.AdmitRate, maxAdmitRate)
	}
	if !(d.Saturation >= 0 && d.Saturation <= maxSaturation) {
		return bad("saturation %v: want 0 to %d", d.Saturation, maxSaturation)
	}
	if d.TTFTP50 < 0 || d.TTFTP99 < 0 {
		return bad("negative TTFT")
	}
	if d.Produced.IsZero() {
		return bad("produced time is missing")
	}
	return nil
}

// Encoding. A digest is a kind byte then fields in a fixed order: strings
// as uvarint length and bytes, counts and versions as uvarints, durations
// as uvarint microseconds, fractions as uvarint parts per 65,535
// (resolution 1.5e-5), Produced as varint Unix nanoseconds. A list (a
// broadcast or a full state) is kindDigestList, uvarint count, then each
// digest as uvarint length and bytes.
const (
	kindDigest     byte = 0xD1
	kindDigestList byte = 0xDA
	fracScale           = 65535
)

// AppendBinary appends d's encoding to b.
func (d *Digest) AppendBinary(b []byte) ([]byte, error) {
	if err := d.Validate(); err != nil {
		return b, err
	}
	return d.appendBinary(b), nil
}

func (d *Digest) appendBinary(b []byte) []byte {
	b = append(b, kindDigest)
	for _, s := range []string{d.Region, d.Cluster, d.Pool, d.Model} {
		b = appendString(b, s)
	}
	b = appendStrings(b, d.Adapters)
	for _, v := range []int{d.ReadyPods, d.TotalPods, d.QueueTotal, d.QueueMax, d.QueueMin, d.Running, d.InFlight} {
		b = binary.AppendUvarint(b, uint64(v))
	}
	for _, f := range []float64{d.KVMean, d.KVMax, d.ErrorRate, d.Headroom, d.PrefixHitRatio} {
		b = binary.AppendUvarint(b, uint64(math.Round(f*fracScale)))
	}
	b = binary.AppendUvarint(b, uint64(d.TTFTP50/time.Microsecond))
	b = binary.AppendUvarint(b, uint64(d.TTFTP99/time.Microsecond))
	b = appendStrings(b, d.HotAdapters)
	b = binary.AppendUvarint(b, d.Version)
	b = binary.AppendVarint(b, d.Produced.UnixNano())
	// Saturation came later: it trails, and a digest without it decodes.
	b = binary.AppendUvarint(b, uint64(math.Round(d.Saturation*fracScale)))
	b = binary.AppendUvarint(b, uint64(d.FreshPods))
	b = binary.AppendUvarint(b, uint64(d.StalePods))
	// So did GateWaiting and AdmitRate (in thousandths).
	b = binary.AppendUvarint(b, uint64(d.GateWaiting))
	b = binary.AppendUvarint(b, uint64(math.Round(d.AdmitRate*1000)))
	b = binary.AppendUvarint(b, uint64(d.GateMaxQueued))
	// And what a pool is and can serve (drift).
	b = appendStrings(b, d.Definition)
	b = appendStrings(b, d.ServedAdapters)
	b = binary.AppendUvarint(b, uint64(d.MaxModelLen))
	return appendStrings(b, d.ServedModels)
}

// UnmarshalBinary decodes one digest and validates it.
func (d *Digest) UnmarshalBinary(buf []byte) error {
	r := reader{buf: buf}
	if r.byte() != kindDigest {
		return fmt.Errorf("%w: not a digest", ErrInvalidDigest)
	}
	*d = Digest{}
	d.Region, d.Cluster, d.Pool, d.Model = r.string(), r.string(), r.string(), r.string()
	d.Adapters = r.strings(maxAdapters)
	for _, p := range []*int{&d.ReadyPods, &d.TotalPods, &d.QueueTotal, &d.QueueMax, &d.QueueMin, &d.Running, &d.InFlight} {
		*p = int(r.uvarint(math.MaxInt32))
	}
	for _, p := range []*float64{&d.KVMean, &d.KVMax, &d.ErrorRate, &d.Headroom, &d.PrefixHitRatio} {
		*p = float64(r.uvarint(fracScale)) / fracScale
	}
	d.TTFTP50 = time.Duration(r.uvarint(math.MaxInt64/1000)) * time.Microsecond
	d.TTFTP99 = time.Duration(r.uvarint(math.MaxInt64/1000)) * time.Microsecond
	d.HotAdapters = r.strings(maxHotAdapters)
	d.Version = r.uvarint(math.MaxUint64)
	d.Produced = time.Unix(0, r.varint())
	if len(r.buf) > 0 {
		d.Saturation = float64(r.uvarint(maxSaturation*fracScale)) / fracScale
		d.FreshPods = int(r.uvarint(math.MaxInt32))
		d.StalePods = int(r.uvarint(math.MaxInt32))
	}
	if len(r.buf) > 0 {
		d.GateWaiting = int(r.uvarint(math.MaxInt32))
		d.AdmitRate = float64(r.uvarint(maxAdmitRate*1000)) / 1000
	}
	if len(r.buf) > 0 {
		d.GateMaxQueued = int(r.uvarint(math.MaxInt32))
	}
	if len(r.buf) > 0 {
		d.Definition = r.strings(maxDefinition)
		d.ServedAdapters = r.strings(maxAdapters)
		d.MaxModelLen = int(r.uvarint(math.MaxInt32))
	}
	if len(r.buf) > 0 {
		d.ServedModels = r.strings(maxAdapters)
	}
	if r.err != nil {
		return fmt.Errorf("%w: %v", ErrInvalidDigest, r.err)
	}
	if len(r.buf) != 0 {
		return fmt.Errorf("%w: %d trailing bytes", ErrInvalidDigest, len(r.buf))
	}
	return d.Validate()
}

// appendList encodes already-encoded digests as a list.
func appendList(b []byte, encoded [][]byte) []byte {
	b = append(b, kindDigestList)
	b = binary.AppendUvarint(b, uint64(len(encoded)))
	for _, e := range encoded {
		b = binary.AppendUvarint(b, uint64(len(e)))
		b = append(b, e...)
	}
	return b
}

// splitList returns the encoded digests of a list; they alias buf.
func splitList(buf []byte) ([][]byte, error) {
	r := reader{buf: buf}
	if r.byte() != kindDigestList {
		return nil, fmt.Errorf("%w: not a digest list", ErrInvalidDigest)
	}
	n := r.uvarint(uint64(len(buf)))
	var out [][]byte
	for range n {
		l := r.uvarint(uint64(len(r.buf)))
		out = append(out, r.take(int(l)))
		if r.err != nil {
			return nil, fmt.Errorf("%w: %v", ErrInvalidDigest, r.err)
		}
	}
	if r.err != nil {
		return nil, fmt.Errorf("%w: %v", ErrInvalidDigest, r.err)
	}
	return out, nil
}

func appendString(b []byte, s string) []byte {
	b = binary.AppendUvarint(b, uint64(len(s)))
	return append(b, s...)
}

func appendStrings(b []byte, ss []string) []byte {
	b = binary.AppendUvarint(b, uint64(len(ss)))
	for _, s := range ss {
		b = appendString(b, s)
	}
	return b
}

// reader decodes with a sticky error: after the first problem every read
// returns zero values.
type reader struct {
	buf []byte
	err error
}

var errShort = errors.New("truncated")

func (r *reader) fail(err error) {
	if r.err == nil {
		r.err = err
	}
	r.buf = nil
}

func (r *reader) byte() byte {
	if len(r.buf) < 1 {
		r.fail(errShort)
		return 0
	}
	c := r.buf[0]
	r.buf = r.buf[1:]
	return c
}

func (r *reader) uvarint(limit uint64) uint64 {
	v, n := binary.Uvarint(r.buf)
	if n <= 0 {
		r.fail(errShort)
		return 0
	}
	if v > limit {
		r.fail(fmt.Errorf("value %d above %d", v, limit))
		return 0
	}
	r.buf = r.buf[n:]
	return v
}

func (r *reader) varint() int64 {
	v, n := binary.Varint(r.buf)
	if n <= 0 {
		r.fail(errShort)
		return 0
	}
	r.buf = r.buf[n:]
	return v
}

func (r *reader) take(n int) []byte {
	if n > len(r.buf) {
		r.fail(errShort)
		return nil
	}
	b := r.buf[:n:n]
	r.buf = r.buf[n:]
	return b
}

func (r *reader) string() string {
	return string(r.take(int(r.uvarint(maxNameLen))))
}

func (r *reader) strings(limit int) []string {
	n := r.uvarint(uint64(limit))
	if n == 0 {
		return nil
	}
	out := make([]string, 0, n)
	for range n {
		out = append(out, r.string())
	}
	if r.err != nil {
		return nil
	}
	return out
}

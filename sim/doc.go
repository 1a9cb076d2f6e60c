// Package sim simulates vLLM model-server pods so that routing policies
// can be measured without GPUs.
//
// A Pod models one vLLM engine: waiting and running queues, a per-step
// token budget with chunked prefill, a bounded KV cache with prefix caching
// and preemption by recompute, and LoRA adapter slots. Its step time comes
// from a GPU Profile (H100, A100, L40S, A10G built in). The same Pod is
// driven two ways:
//
//   - Engine, a deterministic discrete-event simulator on virtual time,
//     which the replay tool drives with the real Tier-1 scheduler (At,
//     Every, Submit, Run; pods built from a Fleet file);
//   - LivePod, an HTTP server per pod speaking the OpenAI API as vLLM does
//     (chat and text completions, streaming or not, /v1/models, /health)
//     with vLLM's /metrics, stepped on the wall clock with a time scale.
//
// Faults (errors, 429s, slowness, hangs, mid-stream crashes) can be
// injected into either at start or at run time.
//
// The package decides how long work takes on a pod and what a pod reports;
// it does not decide where requests go (that is the caller's scheduler),
// and it does not model output content, multi-GPU serving or the network.
// See docs/simulator.md for the model, the profiles' sources and its
// limits. Trace readers live in sim/trace.
package sim

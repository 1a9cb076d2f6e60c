package sim

import (
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"
)

// ModelShape is the part of a model's architecture that sets its cost on a
// GPU: how many FLOPs a token costs, how many bytes each decode step reads,
// and how much KV cache a token occupies.
type ModelShape struct {
	// Name is the model served, e.g. "meta-llama/Llama-3.1-8B-Instruct".
	Name string `json:"name"`
	// Params is the parameter count. A forward pass costs 2×Params FLOPs per
	// token for the dense layers.
	Params float64 `json:"params"`
	// Layers and Hidden size the attention FLOPs, 4×Layers×Hidden per token
	// per token of context.
	Layers int `json:"layers"`
	Hidden int `json:"hidden"`
	// WeightBytes is read once per engine step (decode is memory-bound on it).
	WeightBytes float64 `json:"weightBytes"`
	// KVBytesPerToken is 2 (K and V) × layers × KV heads × head dim × bytes
	// per element. It sizes the KV cache and the bytes each decode step reads
	// per token of context.
	KVBytesPerToken float64 `json:"kvBytesPerToken"`
}

// Llama31_8B is Llama-3.1-8B in BF16: 8.03 B parameters, 32 layers, hidden
// size 4096, 8 KV heads of dimension 128 (grouped-query attention).
var Llama31_8B = ModelShape{
	Name:            "meta-llama/Llama-3.1-8B-Instruct",
	Params:          8.03e9,
	Layers:          32,
	Hidden:          4096,
	WeightBytes:     8.03e9 * 2,
	KVBytesPerToken: 2 * 32 * 8 * 128 * 2, // 131,072 bytes
}

// Profile describes one GPU serving one model with vLLM: the hardware
// figures the step time is computed from and the engine limits vLLM would
// be started with. The zero value is not usable; start from a built-in
// profile (LookupProfile) and override fields.
type Profile struct {
	// Name is the short name used on the command line and in fleet files,
	// e.g. "h100". It is also the GPU label printed for each pod.
	Name string `json:"name"`
	// GPU is the full product name, for humans.
	GPU string `json:"gpu"`
	// Model is the model served. Its Name is the default served model name.
	Model ModelShape `json:"model"`

	// PeakFLOPS is the dense BF16 tensor throughput in FLOP/s from the
	// vendor datasheet (without structured sparsity).
	PeakFLOPS float64 `json:"peakFLOPS"`
	// MFU is the fraction of PeakFLOPS a prefill-heavy step achieves.
	// Lower means slower prefill (longer TTFT at the same load).
	MFU float64 `json:"mfu"`
	// MemBandwidth is the HBM/GDDR bandwidth in bytes/s from the datasheet.
	MemBandwidth float64 `json:"memBandwidth"`
	// BandwidthEfficiency is the fraction of MemBandwidth a decode step
	// achieves. Lower means slower decode (longer inter-token latency).
	BandwidthEfficiency float64 `json:"bandwidthEfficiency"`
	// StepOverhead is the fixed CPU-side cost of one engine step
	// (scheduling, sampling, detokenisation) added to every step.
	StepOverhead time.Duration `json:"stepOverhead"`

	// BlockSize is vLLM's --block-size: tokens per KV block.
	BlockSize int `json:"blockSize"`
	// NumGPUBlocks is the KV cache capacity in blocks, as vLLM logs it at
	// start ("# GPU blocks"). Built-in profiles derive it from memory size,
	// weights and --gpu-memory-utilization 0.9 (see docs/simulator.md).
	NumGPUBlocks int `json:"numGPUBlocks"`
	// MaxNumSeqs is vLLM's --max-num-seqs: the most requests in one batch.
	MaxNumSeqs int `json:"maxNumSeqs"`
	// MaxBatchedTokens is vLLM's --max-num-batched-tokens: the per-step
	// token budget shared by decodes (1 each) and prefill chunks. Larger
	// favours throughput and TTFT of long prompts; smaller protects
	// inter-token latency of running requests.
	MaxBatchedTokens int `json:"maxBatchedTokens"`
	// MaxModelLen is vLLM's --max-model-len: prompt plus output tokens.
	// Longer requests are rejected (ErrContextLength).
	MaxModelLen int `json:"maxModelLen"`
	// MaxLoRAs is vLLM's --max-loras: adapters resident on the GPU at once,
	// and so the most distinct adapters in one batch.
	MaxLoRAs int `json:"maxLoRAs"`
	// AdapterLoadTime is added to a step that must load an adapter into a
	// free (or freed) slot.
	AdapterLoadTime time.Duration `json:"adapterLoadTime"`
}

// gpuMemory figures used to derive NumGPUBlocks.
type gpuMemory struct {
	total   float64 // bytes reported by nvidia-smi
	reserve float64 // activations, CUDA graphs and allocator slack, bytes
}

// kvBlocks is how many KV blocks vLLM would allocate:
// (total×0.9 − weights − reserve) / (block size × KV bytes per token).
func kvBlocks(m gpuMemory, model ModelShape, blockSize int) int {
	const gpuMemoryUtilization = 0.9 // vLLM's default
	free := m.total*gpuMemoryUtilization - model.WeightBytes - m.reserve
	return int(free / (float64(blockSize) * model.KVBytesPerToken))
}

const mib = 1 << 20

func builtinProfiles() map[string]Profile {
	base := Profile{
		Model:               Llama31_8B,
		BandwidthEfficiency: 0.8,
		StepOverhead:        1500 * time.Microsecond,
		BlockSize:           16,
		// vLLM's OpenAI-server defaults for GPUs under 70 GiB and for A100
		// (EngineArgs.get_batch_defaults); H100 overrides them below.
		MaxNumSeqs:       256,
		MaxBatchedTokens: 2048,
		MaxModelLen:      131072,
		MaxLoRAs:         4,
	}
	// card is base on one GPU: its peak FLOPS and model FLOPS utilisation,
	// its memory bandwidth, its memory (which sizes the KV cache) and how
	// long it takes to load a LoRA adapter.
	card := func(name, gpu string, peakFLOPS, mfu, bandwidth float64, mem gpuMemory, adapterLoad time.Duration) Profile {
		p := base
		p.Name, p.GPU = name, gpu
		p.PeakFLOPS, p.MFU = peakFLOPS, mfu
		p.MemBandwidth = bandwidth
		p.NumGPUBlocks = kvBlocks(mem, p.Model, p.BlockSize)
		p.AdapterLoadTime = adapterLoad
		return p
	}
	h100 := card("h100", "NVIDIA H100 SXM5 80GB", 989e12, 0.5, 3.35e12,
		gpuMemory{total: 81559 * mib, reserve: 2e9}, 15*time.Millisecond)
	h100.MaxNumSeqs, h100.MaxBatchedTokens = 1024, 8192 // vLLM's defaults for ≥70 GiB GPUs other than A100
	a100 := card("a100", "NVIDIA A100 SXM4 80GB", 312e12, 0.5, 2.039e12,
		gpuMemory{total: 81920 * mib, reserve: 2e9}, 20*time.Millisecond)
	l40s := card("l40s", "NVIDIA L40S 48GB", 362e12, 0.45, 864e9,
		gpuMemory{total: 46068 * mib, reserve: 1.5e9}, 25*time.Millisecond)
	a10g := card("a10g", "NVIDIA A10G 24GB (AWS g5)", 125e12, 0.35, 600e9,
		gpuMemory{total: 23028 * mib, reserve: 1e9}, 40*time.Millisecond)
	a10g.MaxModelLen = 32768 // the KV cache holds about 35k tokens

	return map[string]Profile{"h100": h100, "a100": a100, "l40s": l40s, "a10g": a10g}
}

var profiles = builtinProfiles()

// ProfileNames lists the built-in profiles, sorted.
func ProfileNames() []string {
	return slices.Sorted(maps.Keys(profiles))
}

// LookupProfile returns a copy of the built-in profile with that name
// (case-insensitive).
func LookupProfile(name string) (Profile, error) {
	p, ok := profiles[strings.ToLower(name)]
	if !ok {
		return Profile{}, fmt.Errorf("sim: unknown GPU profile %q (have %s)", name, strings.Join(ProfileNames(), ", "))
	}
	return p, nil
}

// Validate reports the first field that makes the profile unusable.
func (p *Profile) Validate() error {
	switch {
	case p.Name == "":
		return fmt.Errorf("profile: name is empty")
	case p.PeakFLOPS <= 0 || p.MFU <= 0 || p.MFU > 1:
		return fmt.Errorf("profile %s: peakFLOPS must be > 0 and mfu in (0, 1]", p.Name)
	case p.MemBandwidth <= 0 || p.BandwidthEfficiency <= 0 || p.BandwidthEfficiency > 1:
		return fmt.Errorf("profile %s: memBandwidth must be > 0 and bandwidthEfficiency in (0, 1]", p.Name)
	case p.Model.Params <= 0 || p.Model.WeightBytes <= 0 || p.Model.KVBytesPerToken <= 0:
		return fmt.Errorf("profile %s: model params, weightBytes and kvBytesPerToken must be > 0", p.Name)
	case p.BlockSize <= 0:
		return fmt.Errorf("profile %s: blockSize must be > 0", p.Name)
	case p.NumGPUBlocks <= 0:
		return fmt.Errorf("profile %s: numGPUBlocks must be > 0", p.Name)
	case p.MaxNumSeqs <= 0:
		return fmt.Errorf("profile %s: maxNumSeqs must be > 0", p.Name)
	case p.MaxBatchedTokens <= 0:
		return fmt.Errorf("profile %s: maxBatchedTokens must be > 0", p.Name)
	case p.MaxModelLen <= 0:
		return fmt.Errorf("profile %s: maxModelLen must be > 0", p.Name)
	case p.MaxLoRAs < 0 || p.AdapterLoadTime < 0 || p.StepOverhead < 0:
		return fmt.Errorf("profile %s: maxLoRAs, adapterLoadTime and stepOverhead must not be negative", p.Name)
	}
	return nil
}

// stepCost is the work of one engine step, in the units the step time is
// computed from.
type stepCost struct {
	tokens      int     // tokens through the dense layers (prefill chunk tokens + 1 per decode)
	attnPairs   float64 // Σ query tokens × context tokens they attend to
	kvReadToken float64 // tokens of KV cache read from memory
	loads       int     // adapters loaded this step
}

// stepTime is the duration of one engine step: a roofline of the dense and
// attention FLOPs against the weights and KV bytes read, plus the fixed
// overhead and adapter loads.
func (p *Profile) stepTime(c stepCost) time.Duration {
	flops := 2*p.Model.Params*float64(c.tokens) + 4*float64(p.Model.Layers)*float64(p.Model.Hidden)*c.attnPairs
	compute := flops / (p.PeakFLOPS * p.MFU)
	memory := (p.Model.WeightBytes + p.Model.KVBytesPerToken*c.kvReadToken) / (p.MemBandwidth * p.BandwidthEfficiency)
	sec := max(compute, memory)
	return p.StepOverhead + time.Duration(sec*float64(time.Second)) + time.Duration(c.loads)*p.AdapterLoadTime
}

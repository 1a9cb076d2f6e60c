// Package traces locates the public inference traces the repository ships in
// testdata/traces, for tests and benchmarks. It reads nothing outside the
// repository: the path is found from this source file's own location.
package traces

import (
	"path/filepath"
	"runtime"
)

// The shipped traces.
const (
	Mooncake = "conversation_trace.jsonl"        // Mooncake conversation trace (Apache-2.0)
	Azure    = "AzureLLMInferenceTrace_conv.csv" // Azure LLM inference, conversation (CC-BY-4.0)
)

// Dir is the absolute path of testdata/traces in this checkout.
func Dir() string {
	_, file, _, ok := runtime.Caller(0)
	if !ok {
		return filepath.Join("testdata", "traces")
	}
	return filepath.Join(filepath.Dir(file), "..", "..", "testdata", "traces")
}

// Path is the absolute path of the named trace file.
func Path(name string) string { return filepath.Join(Dir(), name) }

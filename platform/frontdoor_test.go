package platform_test

import (
	"net/http"
	"strings"
	"testing"
)

// The front door's listener refuses request headers beyond 64 KiB (and the 4 KiB Go allows over it) with a
// 431 before any handler runs (the count of header values is bounded by
// the router: tier2's TestRequestReadLimits).
func TestFrontDoorHeaderSize(t *testing.T) {
	d := startDrainDoor(t, "http://127.0.0.1:1", 0)
	for _, size := range []int{80 << 10, 1 << 20} {
		req, _ := http.NewRequest(http.MethodPost, d.url+"/v1/chat/completions", strings.NewReader(`{"model":"chat-model","messages":[]}`))
		req.Header.Set("X-Pad", strings.Repeat("x", size))
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatalf("%d bytes of header: %v", size, err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusRequestHeaderFieldsTooLarge {
			t.Fatalf("%d bytes of header: status %d, want 431", size, resp.StatusCode)
		}
	}
	req, _ := http.NewRequest(http.MethodGet, d.url+"/healthz", nil)
	req.Header.Set("X-Pad", strings.Repeat("x", 32<<10))
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("32 KiB of header: status %d, want 200", resp.StatusCode)
	}
}

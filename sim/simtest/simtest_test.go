package simtest

import (
	"net/http"
	"testing"

	"github.com/meridian-router/meridian/sim"
)

func TestStartPodsServesUntilTheTestEnds(t *testing.T) {
	var pods []*sim.LivePod
	t.Run("pods", func(t *testing.T) {
		pods = StartPods(t, sim.PodSpec{Pod: sim.PodConfig{Name: "p", Profile: Profile(t, "h100"), Model: "m"}}, 2)
		if len(pods) != 2 || pods[0].Name() != "p-0" || pods[1].Name() != "p-1" {
			t.Fatalf("pods %v", pods)
		}
		resp, err := http.Get(pods[0].URL() + "/v1/models")
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
	})
	if _, err := http.Get(pods[0].URL() + "/v1/models"); err == nil {
		t.Fatal("the pod still serves after its test ended")
	}
}

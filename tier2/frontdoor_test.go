package tier2

import (
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/golang-jwt/jwt/v5"

	"github.com/meridian-router/meridian/config"
	"github.com/meridian-router/meridian/internal/testkit"
	"github.com/meridian-router/meridian/regions"
	"github.com/meridian-router/meridian/request"
)

// noTier1 is a Tier-1 URL that is never dialled.
const noTier1 = "http://127.0.0.1:1"

// frontDoorConfig is Region r1 with one cluster, c1, whose Tier-1 is at
// tier1, serving chat-model, and the tenant claims-team, who may call
// chat-model only.
func frontDoorConfig(tier1 string) string {
	return testkit.Topology(testkit.Cluster{Region: "r1", Name: "c1", Tier1: tier1}) +
		testkit.Gateway("r1", "c1") + testkit.ChatScheduler +
		testkit.Tenant("claims-team") + "spec:\n  models: [chat-model]\n"
}

// localFleet is a fleet in Region r1 over snap's Topology.
func localFleet(tb testing.TB, snap *config.Snapshot) *regions.Fleet {
	tb.Helper()
	fleet, err := regions.NewFleet(regions.Config{LocalRegion: "r1", Clusters: regions.ClustersFromTopology(snap.Topology)})
	if err != nil {
		tb.Fatal(err)
	}
	return fleet
}

func frontDoor(t *testing.T) (string, testKey) {
	t.Helper()
	snap := testkit.Snapshot(t, 1, frontDoorConfig(noTier1))
	_, ecK, _ := newKeys(t)
	fleet := localFleet(t, snap)
	r, err := NewRouter(Config{
		Region: "r1", Fleet: fleet, MaxBodyBytes: 1 << 10,
		Auth:   NewAuthenticator(jwtCfg, StaticKeySet(jwk(ecK)), time.Minute, nil),
		Logger: slog.New(slog.DiscardHandler),
	}, snap)
	if err != nil {
		t.Fatal(err)
	}
	return serveFront(t, r.Handler(), nil), ecK
}

// Bad input gets a clear 4xx in OpenAI's error shape, never a 5xx.
func TestFrontDoorRejects(t *testing.T) {
	srv, key := frontDoor(t)
	claims := func() jwt.MapClaims {
		c := goodClaims()
		c["iat"] = time.Now().Add(-time.Minute).Unix()
		c["exp"] = time.Now().Add(time.Hour).Unix()
		return c
	}
	good := "Bearer " + sign(t, key, claims())
	expired := claims()
	expired["exp"] = time.Now().Add(-time.Hour).Unix()
	cases := []struct {
		name, auth, path, body string
		status                 int
		code                   string
	}{
		{"no token", "", "/v1/chat/completions", `{"model":"chat-model","messages":[]}`, 401, "unauthenticated"},
		{"expired token", "Bearer " + sign(t, key, expired), "/v1/chat/completions", `{"model":"chat-model","messages":[]}`, 401, "unauthenticated"},
		{"garbage token", "Bearer abc.def.ghi", "/v1/chat/completions", `{"model":"chat-model","messages":[]}`, 401, "unauthenticated"},
		{"malformed body", good, "/v1/chat/completions", `{"model":`, 400, "bad_request"},
		{"missing model", good, "/v1/chat/completions", `{"messages":[]}`, 400, "missing_model"},
		{"too large", good, "/v1/chat/completions", `{"model":"chat-model","prompt":"` + strings.Repeat("x", 2000) + `"}`, 413, "body_too_large"},
		{"unknown model", good, "/v1/chat/completions", `{"model":"gpt-9","messages":[]}`, 404, "model_not_found"},
		{"no healthy cluster", good, "/v1/chat/completions", `{"model":"chat-model","messages":[]}`, 503, "no_cluster"},
		{"embeddings without input", good, "/v1/embeddings", `{"model":"chat-model","prompt":"x"}`, 400, "missing_required_parameter"},
		{"embeddings, no healthy cluster", good, "/v1/embeddings", `{"model":"chat-model","input":"x"}`, 503, "no_cluster"},
		{"responses with a bad input", good, "/v1/responses", `{"model":"chat-model","input":5}`, 400, "invalid_type"},
		{"unrouted endpoint", good, "/v1/audio/speech", `{"model":"chat-model","input":"x"}`, 404, "not_found"},
		{"unknown route", good, "/v1/nope", `{}`, 404, "not_found"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			req, _ := http.NewRequest(http.MethodPost, srv+tc.path, strings.NewReader(tc.body))
			if tc.auth != "" {
				req.Header.Set("Authorization", tc.auth)
			}
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			b, _ := io.ReadAll(resp.Body)
			if resp.StatusCode != tc.status {
				t.Fatalf("status %d, want %d: %s", resp.StatusCode, tc.status, b)
			}
			if id := resp.Header.Get("X-Request-Id"); !request.ValidID(id) {
				t.Errorf("x-request-id %q", id)
			}
			var e testkit.OpenAIError
			if err := json.Unmarshal(b, &e); err != nil || e.Error.Code != tc.code || e.Error.Message == "" || e.Error.Type == "" {
				t.Fatalf("body %s: want OpenAI error with code %q", b, tc.code)
			}
		})
	}
	resp, err := http.Get(srv + "/readyz")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusServiceUnavailable {
		t.Fatalf("/readyz without digests = %d, want 503", resp.StatusCode)
	}
}

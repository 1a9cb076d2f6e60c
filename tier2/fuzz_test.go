package tier2

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"testing"
	"time"

	"github.com/golang-jwt/jwt/v5"
)

// FuzzStreamAccount checks the relay's accounting on arbitrary events: it
// never panics, never counts negative or wrapped tokens, removes per-chunk
// usage when asked and leaves valid JSON valid, and reads the same counts
// encoding/json does from a well-formed usage object.
func FuzzStreamAccount(f *testing.F) {
	for _, s := range []string{
		`data: {"id":"c","choices":[{"index":0,"delta":{"content":"hi"}}],"usage":{"prompt_tokens":3,"completion_tokens":1,"total_tokens":4}}`,
		`data: {"usage":{"prompt_tokens":3,"completion_tokens":9,"total_tokens":12},"choices":[]}`,
		`data: {"choices":[{"text":"x"}],"usage":null}`,
		`data: {"choices":[{"delta":{"content":"\"usage\":{\"total_tokens\":99}"}}]}`,
		`data: {"usage" : { "completion_tokens" : 99999999999999999999999 } , "choices":[{"text":"a"}]}`,
		`data: {"usage":{"prompt_tokens_details":{"cached_tokens":2},"prompt_tokens":1}}`,
		`data: {"usage":{`,
		`data: {"type":"response.completed","response":{"usage":{"input_tokens":3,"output_tokens":9,"total_tokens":12}}}`,
		`data: {"type":"response.output_text.delta","delta":"hi"}`,
	} {
		f.Add([]byte(s), true, true)
	}
	f.Fuzz(func(t *testing.T, line []byte, hideFinal, hideContinuous bool) {
		in := append([]byte(nil), line...)
		// A Response stream's account (hideFinal stands for the flag: a
		// Response stream hides nothing).
		var ra streamAccount
		ra.responses = true
		if _, rev := ra.read(append([]byte(nil), line...), false, false); rev.drop {
			t.Fatalf("a Response event was dropped: %q", in)
		} else if ra.commit(rev); ra.tokens(&call{}) < 0 {
			t.Fatalf("Response tokens %d < 0 for %q", ra.tokens(&call{}), in)
		}
		var a streamAccount
		out, ev := a.read(line, hideFinal, hideContinuous)
		a.commit(ev)
		if n := a.tokens(&call{}); n < 0 {
			t.Fatalf("tokens %d < 0 for %q", n, in)
		}
		payload := bytes.TrimPrefix(in, []byte("data: "))
		if !json.Valid(payload) {
			return
		}
		if !ev.final && !ev.drop && !json.Valid(bytes.TrimPrefix(out, []byte("data: "))) {
			t.Fatalf("relayed line is no longer JSON: %q from %q", out, in)
		}
		var v struct {
			Usage *struct {
				Prompt     *json.Number `json:"prompt_tokens"`
				Completion *json.Number `json:"completion_tokens"`
			} `json:"usage"`
		}
		if json.Unmarshal(payload, &v) != nil || v.Usage == nil || v.Usage.Completion == nil {
			return
		}
		if c, err := v.Usage.Completion.Int64(); err == nil && c < 1<<40 && ev.usage.ok && !bytes.Contains(payload, []byte(`\`)) &&
			bytes.Count(payload, []byte(`"usage"`)) == 1 && bytes.Count(payload, []byte(`"completion_tokens"`)) == 1 && ev.usage.completion != c {
			t.Fatalf("completion_tokens %d, encoding/json reads %d in %q", ev.usage.completion, c, payload)
		}
		if hideContinuous && !ev.final && ev.usage.ok && bytes.Contains(out, []byte(`"usage":{`)) && bytes.Count(payload, []byte(`"usage"`)) == 1 {
			t.Fatalf("per-chunk usage not removed: %q", out)
		}
	})
}

// FuzzAuthenticate feeds arbitrary bearer tokens and header values to the
// JWT path: it never panics and never accepts a token it did not see
// signed; every refusal wraps ErrUnauthenticated.
func FuzzAuthenticate(f *testing.F) {
	rsaK, ecK, edK := newKeys(&testing.T{})
	good := func(k testKey) string {
		tok := jwt.NewWithClaims(k.method, goodClaims())
		tok.Header["kid"] = k.kid
		s, _ := tok.SignedString(k.priv)
		return s
	}
	for _, s := range []string{good(rsaK), good(ecK), good(edK), "abc.def.ghi", "", "e30.e30.", "eyJhbGciOiJub25lIn0.e30."} {
		f.Add("Bearer " + s)
	}
	f.Add("Bearer eyJhbGciOiJFUzI1NiIsImNyaXQiOlsiYjY0Il19.e30.sig")
	keys := StaticKeySet(jwk(rsaK), jwk(ecK), jwk(edK))
	f.Fuzz(func(t *testing.T, authorization string) {
		a := NewAuthenticator(jwtCfg, keys, time.Minute, func() time.Time { return authNow })
		a.CacheTTL = 0
		c, err := a.Authenticate(context.Background(), authorization)
		if err != nil {
			if !errors.Is(err, ErrUnauthenticated) {
				t.Fatalf("error %v does not wrap ErrUnauthenticated", err)
			}
			return
		}
		// Only the signed seeds can verify: any change to their claims
		// breaks the signature, so an accepted token carries their claims.
		if c.Tenant != "claims-team" || c.Subject != "svc-claims" || c.Band != "Critical" {
			t.Fatalf("accepted a token with claims nobody signed: %q → %+v", authorization, c)
		}
	})
}

package request

import (
	"bytes"
	"encoding/json"
	"fmt"
)

// WithModel returns raw, a request body whose "model" is from, with its
// "model" set to to (GIE's x-gateway-model-name-rewrite: the model server
// is asked for the rewritten name). The common case is one byte edit of
// the original, which may be megabytes of prompt; anything unusual (the
// field written twice, spaces around the colon) goes through a full
// decode. raw is not modified.
func WithModel(raw []byte, from, to string) ([]byte, error) {
	if from == to {
		return raw, nil
	}
	q, _ := json.Marshal(from)
	old := append([]byte(`"model":`), q...)
	if bytes.Count(raw, old) == 1 {
		nq, _ := json.Marshal(to)
		return bytes.Replace(raw, old, append([]byte(`"model":`), nq...), 1), nil
	}
	var m map[string]json.RawMessage
	if err := json.Unmarshal(raw, &m); err != nil {
		return nil, fmt.Errorf("request: malformed JSON body: %w", err)
	}
	m["model"], _ = json.Marshal(to)
	return json.Marshal(m)
}

package sim

import (
	"context"
	"encoding/base64"
	"encoding/binary"
	"math"
	"net/http"
	"strings"
	"testing"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/responses"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
)

// TestLiveEmbeddings calls /v1/embeddings through the OpenAI SDK with
// each shape of input.
func TestLiveEmbeddings(t *testing.T) {
	lp := startLive(t, PodSpec{Pod: PodConfig{Model: testModel}}, 1)[0]
	c := client(lp)
	ctx := context.Background()
	for _, tc := range []struct {
		name   string
		input  openai.EmbeddingNewParamsInputUnion
		n      int
		tokens int64
	}{
		{"string", openai.EmbeddingNewParamsInputUnion{OfString: openai.String(strings.Repeat("abcd", 10))}, 1, 10},
		{"strings", openai.EmbeddingNewParamsInputUnion{OfArrayOfStrings: []string{"abcdabcd", "abcd"}}, 2, 3},
		{"tokens", openai.EmbeddingNewParamsInputUnion{OfArrayOfTokens: []int64{1, 2, 3, 4, 5}}, 1, 5},
		{"token arrays", openai.EmbeddingNewParamsInputUnion{OfArrayOfTokenArrays: [][]int64{{1, 2}, {3, 4, 5}}}, 1, 5},
	} {
		t.Run(tc.name, func(t *testing.T) {
			res, err := c.Embeddings.New(ctx, openai.EmbeddingNewParams{Model: testModel, Input: tc.input})
			if err != nil {
				t.Fatal(err)
			}
			if len(res.Data) != tc.n || len(res.Data[0].Embedding) != embeddingDims || res.Usage.PromptTokens != tc.tokens || res.Usage.TotalTokens != tc.tokens {
				t.Fatalf("got %d vectors of %d, usage %+v; want %d of %d, %d tokens", len(res.Data), len(res.Data[0].Embedding), res.Usage, tc.n, embeddingDims, tc.tokens)
			}
		})
	}
	// Equal inputs give equal vectors; base64 carries the same floats.
	res, err := c.Embeddings.New(ctx, openai.EmbeddingNewParams{Model: testModel, Dimensions: openai.Int(8),
		Input: openai.EmbeddingNewParamsInputUnion{OfArrayOfStrings: []string{"same", "same", "other"}}})
	if err != nil {
		t.Fatal(err)
	}
	if d := res.Data; len(d[0].Embedding) != 8 || d[0].Embedding[0] != d[1].Embedding[0] || d[0].Embedding[0] == d[2].Embedding[0] {
		t.Errorf("vectors %v", d)
	}
	b64, err := c.Embeddings.New(ctx, openai.EmbeddingNewParams{Model: testModel, Dimensions: openai.Int(8), EncodingFormat: openai.EmbeddingNewParamsEncodingFormatBase64,
		Input: openai.EmbeddingNewParamsInputUnion{OfString: openai.String("same")}})
	if err != nil {
		t.Fatal(err)
	}
	raw, err := base64.StdEncoding.DecodeString(b64.Data[0].JSON.Embedding.Raw()[1 : len(b64.Data[0].JSON.Embedding.Raw())-1])
	if err != nil || len(raw) != 4*8 || math.Float32frombits(binary.LittleEndian.Uint32(raw)) != float32(res.Data[0].Embedding[0]) {
		t.Errorf("base64 %q (%v)", b64.Data[0].JSON.Embedding.Raw(), err)
	}
	// A model the pod does not serve is a 404, an empty input a 400.
	if _, err := c.Embeddings.New(ctx, openai.EmbeddingNewParams{Model: "other", Input: openai.EmbeddingNewParamsInputUnion{OfString: openai.String("x")}}); !isStatus(err, 404) {
		t.Errorf("unknown model: %v", err)
	}
	if _, err := c.Embeddings.New(ctx, openai.EmbeddingNewParams{Model: testModel, Input: openai.EmbeddingNewParamsInputUnion{OfArrayOfStrings: []string{}}}); !isStatus(err, 400) {
		t.Errorf("empty input: %v", err)
	}
}

func isStatus(err error, code int) bool {
	apiErr, ok := err.(*openai.Error)
	return ok && apiErr.StatusCode == code
}

// TestLiveResponses calls /v1/responses through the OpenAI SDK, whole and
// streamed: the stream's typed events end with response.completed, whose
// usage agrees with the text streamed and the whole answer's.
func TestLiveResponses(t *testing.T) {
	lp := startLive(t, PodSpec{Pod: PodConfig{Model: testModel}}, 1)[0]
	c := client(lp)
	ctx := context.Background()
	params := responses.ResponseNewParams{Model: testModel, Instructions: openai.String("Be brief."), MaxOutputTokens: openai.Int(7),
		Input: responses.ResponseNewParamsInputUnion{OfString: openai.String(strings.Repeat("hello ", 20))}}
	res, err := c.Responses.New(ctx, params)
	if err != nil {
		t.Fatal(err)
	}
	if res.Status != "completed" || res.Usage.OutputTokens != 7 || res.Usage.InputTokens < 30 || res.OutputText() != tokenText(0, 7) {
		t.Fatalf("response %s %+v %q", res.Status, res.Usage, res.OutputText())
	}
	stream := c.Responses.NewStreaming(ctx, params)
	var text strings.Builder
	var types []string
	var final responses.Response
	for stream.Next() {
		ev := stream.Current()
		types = append(types, ev.Type)
		switch ev.Type {
		case "response.output_text.delta":
			text.WriteString(ev.Delta)
		case "response.completed":
			final = ev.Response
		}
	}
	if err := stream.Err(); err != nil {
		t.Fatal(err)
	}
	if types[0] != "response.created" || types[len(types)-1] != "response.completed" {
		t.Errorf("events %v", types)
	}
	if text.String() != tokenText(0, 7) || final.Usage.OutputTokens != 7 || final.Usage.InputTokens != res.Usage.InputTokens || final.OutputText() != text.String() {
		t.Errorf("streamed %q, final %+v %q", text.String(), final.Usage, final.OutputText())
	}
	// Items in, as a conversation.
	res, err = c.Responses.New(ctx, responses.ResponseNewParams{Model: testModel, Input: responses.ResponseNewParamsInputUnion{
		OfInputItemList: responses.ResponseInputParam{responses.ResponseInputItemParamOfMessage("hi", responses.EasyInputMessageRoleUser)}}})
	if err != nil || res.Usage.InputTokens == 0 {
		t.Fatalf("items: %v %+v", err, res)
	}
}

// TestLiveRequestIDAndTrace: a pod answers with the request's
// x-request-id (a new one when there is none), and with a tracer its span
// continues the caller's traceparent.
func TestLiveRequestIDAndTrace(t *testing.T) {
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	lp := startLive(t, PodSpec{Pod: PodConfig{Model: testModel}, Tracer: tp.Tracer("sim")}, 1)[0]
	send := func(h http.Header) *http.Response {
		req, _ := http.NewRequest(http.MethodPost, lp.URL()+"/v1/completions", strings.NewReader(`{"model":"`+testModel+`","prompt":"hi","max_tokens":1}`))
		for k, v := range h {
			req.Header[k] = v
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp
	}
	const parent = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
	resp := send(http.Header{"X-Request-Id": {"abc-123"}, "Traceparent": {parent}})
	if got := resp.Header.Get("X-Request-Id"); got != "abc-123" {
		t.Errorf("x-request-id %q, want the caller's", got)
	}
	if got := send(nil).Header.Get("X-Request-Id"); !strings.HasPrefix(got, "req_") {
		t.Errorf("x-request-id %q, want a new req_ id", got)
	}
	spans := rec.Ended()
	if len(spans) != 2 {
		t.Fatalf("%d spans", len(spans))
	}
	sc := spans[0].Parent()
	if spans[0].Name() != "llm_request" || sc.TraceID().String() != "0af7651916cd43dd8448eb211c80319c" || sc.SpanID().String() != "b7ad6b7169203331" {
		t.Errorf("span %s parent %v", spans[0].Name(), sc)
	}
}

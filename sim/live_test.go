package sim

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"testing"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/meridian-router/meridian/config"
)

const testModel = "meta-llama/Llama-3.1-8B-Instruct"

// startLive starts k fast live pods (1000× real time) and closes them when
// the test ends.
func startLive(t *testing.T, spec PodSpec, k int) []*LivePod {
	t.Helper()
	if spec.Pod.Profile.Name == "" {
		spec.Pod.Profile = mustProfile(t, "h100")
	}
	if spec.TimeScale == 0 {
		spec.TimeScale = 1000
	}
	pods, err := StartPods(context.Background(), spec, k)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		for _, p := range pods {
			p.Close()
		}
	})
	return pods
}

func client(lp *LivePod) openai.Client {
	return openai.NewClient(option.WithBaseURL(lp.URL()+"/v1/"), option.WithAPIKey("unused"), option.WithMaxRetries(0),
		// One shared transport: each client otherwise builds its own, whose
		// idle connection is never closed (a request a client: a socket
		// pair leaked per request, thousands in TestCanaryEndToEnd).
		option.WithHTTPClient(http.DefaultClient))
}

// A long system prompt so a repeated conversation hits the prefix cache.
var system = strings.Repeat("You are a careful assistant who answers in one short sentence. ", 40)

func TestLiveChat(t *testing.T) {
	lp := startLive(t, PodSpec{Pod: PodConfig{Adapters: []string{"sql-lora"}}}, 1)[0]
	c := client(lp)
	ctx := context.Background()
	params := openai.ChatCompletionNewParams{
		Model:     testModel,
		Messages:  []openai.ChatCompletionMessageParamUnion{openai.SystemMessage(system), openai.UserMessage("What is 2+2?")},
		MaxTokens: openai.Int(7),
	}
	first, err := c.Chat.Completions.New(ctx, params)
	if err != nil {
		t.Fatal(err)
	}
	if len(first.Choices) != 1 || first.Choices[0].FinishReason != "length" || first.Choices[0].Message.Content != tokenText(0, 7) {
		t.Errorf("choices = %+v", first.Choices)
	}
	u := first.Usage
	wantPrompt := int64((len("system\n"+system+"\nuser\nWhat is 2+2?\n") + 3) / 4)
	if u.CompletionTokens != 7 || u.PromptTokens != wantPrompt || u.TotalTokens != wantPrompt+7 || u.PromptTokensDetails.CachedTokens != 0 {
		t.Errorf("first usage = %+v, want prompt %d, completion 7, nothing cached", u, wantPrompt)
	}
	if first.Model != testModel {
		t.Errorf("model = %q", first.Model)
	}

	// The same conversation again, streamed with a usage chunk: its
	// prefix is now cached.
	params.StreamOptions = openai.ChatCompletionStreamOptionsParam{IncludeUsage: openai.Bool(true)}
	stream := c.Chat.Completions.NewStreaming(ctx, params)
	var acc openai.ChatCompletionAccumulator
	chunks := 0
	for stream.Next() {
		chunk := stream.Current()
		acc.AddChunk(chunk)
		chunks++
	}
	if err := stream.Err(); err != nil {
		t.Fatal(err)
	}
	if got := acc.Choices[0].Message.Content; got != tokenText(0, 7) {
		t.Errorf("streamed content %q, want %q", got, tokenText(0, 7))
	}
	// Tokens of several steps may share a chunk when the reader lags, so
	// only the role, some content and the finish chunk are certain.
	if chunks < 3 {
		t.Errorf("%d chunks, want at least role, content and finish", chunks)
	}
	if acc.Usage.CompletionTokens != 7 || acc.Usage.PromptTokensDetails.CachedTokens == 0 {
		t.Errorf("streamed usage = %+v, want 7 completion tokens and a cache hit", acc.Usage)
	}
	if acc.Choices[0].FinishReason != "length" {
		t.Errorf("finish reason %q", acc.Choices[0].FinishReason)
	}

	// An adapter is a model name too.
	params.Model = "sql-lora"
	params.StreamOptions = openai.ChatCompletionStreamOptionsParam{}
	resp, err := c.Chat.Completions.New(ctx, params)
	if err != nil || resp.Model != "sql-lora" {
		t.Fatalf("adapter request: %v, model %q", err, resp.Model)
	}
	m := lp.Metrics()
	if m.RequestsOK != 3 || m.GenerationTokens != 21 || m.PrefixCacheHits == 0 {
		t.Errorf("metrics after three requests = %+v", m)
	}
}

func TestLiveCompletions(t *testing.T) {
	outcomes := make(chan Outcome, 2)
	lp := startLive(t, PodSpec{DefaultMaxTokens: 5, OnOutcome: func(o Outcome) { outcomes <- o }}, 1)[0]
	c := client(lp)
	ctx := context.Background()
	params := openai.CompletionNewParams{
		Model:  testModel,
		Prompt: openai.CompletionNewParamsPromptUnion{OfString: openai.String("Once upon a time")},
	}
	resp, err := c.Completions.New(ctx, params)
	if err != nil {
		t.Fatal(err)
	}
	if resp.Choices[0].Text != tokenText(0, 5) || resp.Choices[0].FinishReason != "stop" || resp.Usage.CompletionTokens != 5 || resp.Usage.PromptTokens != 4 {
		t.Errorf("response = %+v", resp)
	}
	params.MaxTokens = openai.Int(3)
	params.StreamOptions = openai.ChatCompletionStreamOptionsParam{IncludeUsage: openai.Bool(true)}
	stream := c.Completions.NewStreaming(ctx, params)
	var text strings.Builder
	var usage int64
	for stream.Next() {
		ch := stream.Current()
		for _, c := range ch.Choices {
			text.WriteString(c.Text)
		}
		if ch.Usage.CompletionTokens > 0 {
			usage = ch.Usage.CompletionTokens
		}
	}
	if err := stream.Err(); err != nil {
		t.Fatal(err)
	}
	if text.String() != tokenText(0, 3) || usage != 3 {
		t.Errorf("streamed %q with usage %d, want %q and 3", text.String(), usage, tokenText(0, 3))
	}
	for _, want := range []int{5, 3} {
		o := <-outcomes
		if o.Err != nil || o.OutputTokens != want || o.Pod != lp.Name() || o.TTFT() <= 0 || o.Finish < o.FirstToken {
			t.Errorf("outcome %+v, want %d tokens", o, want)
		}
	}
}

func TestLiveErrors(t *testing.T) {
	lp := startLive(t, PodSpec{}, 1)[0]
	c := client(lp)
	ctx := context.Background()
	_, err := c.Chat.Completions.New(ctx, openai.ChatCompletionNewParams{
		Model: "no-such-model", Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage("hi")},
	})
	var apiErr *openai.Error
	if !errors.As(err, &apiErr) || apiErr.StatusCode != http.StatusNotFound || !strings.Contains(apiErr.Message, "no-such-model") {
		t.Errorf("unknown model: %v", err)
	}

	cases := []struct {
		name, path, body string
		status           int
	}{
		{"bad json", "/v1/chat/completions", `{"model":`, 400},
		{"no messages", "/v1/chat/completions", `{"model":"` + testModel + `","messages":[]}`, 400},
		{"zero max tokens", "/v1/completions", `{"prompt":"x","max_tokens":0}`, 400},
		{"two prompts", "/v1/completions", `{"prompt":["a","b"]}`, 400},
		{"too long", "/v1/completions", `{"prompt":"x","max_tokens":200000}`, 400},
		{"unknown model", "/v1/completions", `{"model":"gpt-9","prompt":"x"}`, 404},
		{"unknown route", "/v2/nothing", `{}`, 404},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			resp, err := http.Post(lp.URL()+tc.path, "application/json", strings.NewReader(tc.body))
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			var e apiError
			if err := json.NewDecoder(resp.Body).Decode(&e); err != nil {
				t.Fatalf("error body: %v", err)
			}
			if resp.StatusCode != tc.status || e.Error.Code != tc.status || e.Error.Message == "" || e.Error.Type == "" {
				t.Errorf("status %d, body %+v; want %d in OpenAI error shape", resp.StatusCode, e, tc.status)
			}
		})
	}
}

func putFaults(t *testing.T, lp *LivePod, f string) {
	t.Helper()
	req, _ := http.NewRequest(http.MethodPut, lp.URL()+"/sim/faults", strings.NewReader(f))
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("PUT /sim/faults %s: %s", f, resp.Status)
	}
}

func TestLiveFaults(t *testing.T) {
	lp := startLive(t, PodSpec{}, 1)[0]
	c := client(lp)
	ctx := context.Background()
	chat := openai.ChatCompletionNewParams{
		Model: testModel, Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage("hello there")},
		MaxTokens: openai.Int(6),
	}

	putFaults(t, lp, `{"rejectRate":1}`)
	resp, err := http.Post(lp.URL()+"/v1/completions", "application/json", strings.NewReader(`{"prompt":"x"}`))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusTooManyRequests || resp.Header.Get("Retry-After") == "" {
		t.Errorf("reject: %s, Retry-After %q", resp.Status, resp.Header.Get("Retry-After"))
	}

	putFaults(t, lp, `{"errorRate":1}`)
	_, err = c.Chat.Completions.New(ctx, chat)
	var apiErr *openai.Error
	if !errors.As(err, &apiErr) || apiErr.StatusCode != http.StatusInternalServerError {
		t.Errorf("error rate 1: %v", err)
	}

	// A crash after 3 tokens cuts the stream: the client sees some content
	// and then an error, never a finish reason.
	putFaults(t, lp, `{"crashAfterTokens":3}`)
	stream := c.Chat.Completions.NewStreaming(ctx, chat)
	var content string
	finished := false
	for stream.Next() {
		for _, ch := range stream.Current().Choices {
			content += ch.Delta.Content
			finished = finished || ch.FinishReason != ""
		}
	}
	if stream.Err() == nil || finished || content != tokenText(0, 3) {
		t.Errorf("crash: content %q, finished %v, err %v; want 3 tokens then an error", content, finished, stream.Err())
	}

	// A hung pod accepts the request and makes no progress until the
	// hang is lifted.
	putFaults(t, lp, `{"hang":true}`)
	// The response headers are sent once the request is queued, and
	// NewStreaming returns with them; the role chunk, as vLLM's, comes
	// only with the first token.
	stream = c.Chat.Completions.NewStreaming(ctx, chat)
	if err := stream.Err(); err != nil {
		t.Fatalf("hung stream: %v", err)
	}
	if m := lp.Metrics(); m.Waiting != 1 || m.GenerationTokens != 3 {
		t.Errorf("while hung: %+v, want 1 waiting and only the 3 crashed tokens generated", m)
	}
	if err := lp.SetFaults(Faults{}); err != nil {
		t.Fatal(err)
	}
	content = ""
	for stream.Next() {
		for _, ch := range stream.Current().Choices {
			content += ch.Delta.Content
		}
	}
	if stream.Err() != nil || content != tokenText(0, 6) {
		t.Errorf("after the hang: %q, %v", content, stream.Err())
	}

	if err := lp.SetFaults(Faults{ErrorRate: 2}); err == nil {
		t.Error("error rate 2 accepted")
	}
	req, _ := http.NewRequest(http.MethodPut, lp.URL()+"/sim/faults", strings.NewReader(`{"bogus":1}`))
	resp, err = http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusBadRequest {
		t.Errorf("unknown fault field: %s", resp.Status)
	}
}

func scrapeFamilies(t *testing.T, lp *LivePod) map[string]*dto.MetricFamily {
	t.Helper()
	resp, err := http.Get(lp.URL() + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var buf bytes.Buffer
	buf.ReadFrom(resp.Body)
	p := expfmt.NewTextParser(model.LegacyValidation)
	fams, err := p.TextToMetricFamilies(&buf)
	if err != nil {
		t.Fatalf("parse /metrics: %v", err)
	}
	return fams
}

func label(m *dto.Metric, name string) string {
	for _, l := range m.GetLabel() {
		if l.GetName() == name {
			return l.GetValue()
		}
	}
	return ""
}

func TestLiveMetrics(t *testing.T) {
	pods := startLive(t, PodSpec{
		Pod:         PodConfig{Name: "pod", Adapters: []string{"a", "b"}},
		ConstLabels: map[string]string{"pool": "test"},
	}, 2)
	if pods[0].Addr() == pods[1].Addr() || pods[1].Name() != "pod-1" {
		t.Fatalf("pods %v and %v", pods[0], pods[1])
	}
	lp := pods[0]
	c := client(lp)
	for range 2 {
		if _, err := c.Completions.New(context.Background(), openai.CompletionNewParams{
			Model: "a", Prompt: openai.CompletionNewParamsPromptUnion{OfString: openai.String(system)}, MaxTokens: openai.Int(2),
		}); err != nil {
			t.Fatal(err)
		}
	}
	fams := scrapeFamilies(t, lp)
	gauges := []string{"vllm:num_requests_waiting", "vllm:num_requests_running", "vllm:kv_cache_usage_perc"}
	for _, name := range gauges {
		f := fams[name]
		if f == nil || f.GetType() != dto.MetricType_GAUGE || label(f.Metric[0], "model_name") != testModel || label(f.Metric[0], "pool") != "test" {
			t.Errorf("%s = %v", name, f)
		}
	}
	lora := fams["vllm:lora_requests_info"]
	if lora == nil || label(lora.Metric[0], "max_lora") != "4" || lora.Metric[0].GetGauge().GetValue() < 1e9 {
		t.Errorf("lora_requests_info = %v", lora)
	}
	cache := fams["vllm:cache_config_info"]
	if cache == nil || label(cache.Metric[0], "block_size") != "16" || label(cache.Metric[0], "num_gpu_blocks") == "" {
		t.Errorf("cache_config_info = %v", cache)
	}
	hits, queries := fams["vllm:prefix_cache_hits_total"], fams["vllm:prefix_cache_queries_total"]
	if hits == nil || queries == nil || hits.GetType() != dto.MetricType_COUNTER ||
		hits.Metric[0].GetCounter().GetValue() == 0 || queries.Metric[0].GetCounter().GetValue() <= hits.Metric[0].GetCounter().GetValue() {
		t.Errorf("prefix cache counters: hits %v queries %v", hits, queries)
	}
	for _, name := range []string{"vllm:time_to_first_token_seconds", "vllm:e2e_request_latency_seconds", "vllm:time_per_output_token_seconds",
		"vllm:request_prompt_tokens", "vllm:request_generation_tokens"} {
		f := fams[name]
		if f == nil || f.GetType() != dto.MetricType_HISTOGRAM || f.Metric[0].GetHistogram().GetSampleCount() != 2 || label(f.Metric[0], "model_name") != testModel {
			t.Errorf("%s = %v", name, f)
		}
	}
	if fams["vllm:gpu_cache_usage_perc"] != nil {
		t.Error("legacy KV gauge exposed by default")
	}

	for _, tc := range []struct {
		names        MetricNames
		want, absent string
	}{
		{MetricsVLLMLegacy, "vllm:gpu_cache_usage_perc", "vllm:kv_cache_usage_perc"},
		{MetricsSGLang, "sglang:num_queue_reqs", "vllm:num_requests_waiting"},
	} {
		lp := startLive(t, PodSpec{Metrics: tc.names}, 1)[0]
		fams := scrapeFamilies(t, lp)
		if fams[tc.want] == nil || fams[tc.absent] != nil {
			t.Errorf("%s: have %s %v, %s %v", tc.names, tc.want, fams[tc.want] != nil, tc.absent, fams[tc.absent] != nil)
		}
		if tc.names == MetricsSGLang && (fams["sglang:num_running_reqs"] == nil || fams["sglang:token_usage"] == nil) {
			t.Errorf("sglang names missing: %v", fams)
		}
	}
}

func TestLiveModelsAndHealth(t *testing.T) {
	lp := startLive(t, PodSpec{Pod: PodConfig{Adapters: []string{"x"}}}, 1)[0]
	c := client(lp)
	page, err := c.Models.List(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	var ids []string
	for _, m := range page.Data {
		ids = append(ids, m.ID)
	}
	if strings.Join(ids, ",") != testModel+",x" {
		t.Errorf("models = %v", ids)
	}
	resp, err := http.Get(lp.URL() + "/health")
	if err != nil || resp.StatusCode != 200 {
		t.Errorf("health: %v %v", resp, err)
	}
	resp.Body.Close()
	lp.Close()
	if _, err := http.Get(lp.URL() + "/health"); err == nil {
		t.Error("closed pod still answers")
	}

	// A restart on the same address.
	_, port, _ := net.SplitHostPort(lp.Addr())
	n, _ := strconv.Atoi(port)
	spec := PodSpec{Pod: lp.Config(), TimeScale: 1000}
	again, err := StartPod(context.Background(), spec, n)
	if err != nil {
		t.Fatalf("restart on port %d: %v", n, err)
	}
	defer again.Close()
	resp, err = http.Get(again.URL() + "/health")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 200 || again.Addr() != lp.Addr() {
		t.Errorf("restarted pod at %s: %s", again.Addr(), resp.Status)
	}
}

func TestStaticEndpoints(t *testing.T) {
	pods := startLive(t, PodSpec{Pod: PodConfig{Labels: map[string]string{"gpu": "h100", "region": "r1"}}}, 2)
	b, err := StaticEndpoints("sim", pods)
	if err != nil {
		t.Fatal(err)
	}
	docs, errs := config.Decode("sim.yaml", b)
	if err := errs.Err(); err != nil {
		t.Fatalf("%v\n%s", err, b)
	}
	snap, err := config.Build(docs, 1)
	if err != nil {
		t.Fatalf("%v\n%s", err, b)
	}
	if len(snap.StaticEndpoints) != 1 || len(snap.StaticEndpoints[0].Spec.Endpoints) != 2 {
		t.Fatalf("snapshot %+v", snap.StaticEndpoints)
	}
	ep := snap.StaticEndpoints[0].Spec.Endpoints[1]
	if ep.Name != "h100-1" || ep.Address != pods[1].Addr() || ep.Labels["region"] != "r1" {
		t.Errorf("endpoint %+v", ep)
	}
}

// TestLiveConcurrent streams many requests at once through one pod: each
// gets its own complete answer, and the pod batches them.
func TestLiveConcurrent(t *testing.T) {
	lp := startLive(t, PodSpec{TimeScale: 100}, 1)[0]
	c := client(lp)
	const n = 16
	errs := make(chan error, n)
	for i := range n {
		go func() {
			stream := c.Completions.NewStreaming(context.Background(), openai.CompletionNewParams{
				Model:     testModel,
				Prompt:    openai.CompletionNewParamsPromptUnion{OfString: openai.String(strings.Repeat("x", 100*(i+1)))},
				MaxTokens: openai.Int(int64(10 + i)),
			})
			var text strings.Builder
			for stream.Next() {
				for _, ch := range stream.Current().Choices {
					text.WriteString(ch.Text)
				}
			}
			if err := stream.Err(); err != nil {
				errs <- err
				return
			}
			if text.String() != tokenText(0, 10+i) {
				errs <- fmt.Errorf("request %d got %q", i, text.String())
				return
			}
			errs <- nil
		}()
	}
	for range n {
		if err := <-errs; err != nil {
			t.Error(err)
		}
	}
	m := lp.Metrics()
	want := uint64(0)
	for i := range n {
		want += uint64(10 + i)
	}
	if m.RequestsOK != n || m.GenerationTokens != want || m.Running+m.Waiting != 0 {
		t.Errorf("metrics %+v, want %d requests and %d tokens", m, n, want)
	}
}

// TestLiveCancel: a client that gives up on a hung pod withdraws its
// request, which WaitFor observes without sleeping.
func TestLiveCancel(t *testing.T) {
	lp := startLive(t, PodSpec{Pod: PodConfig{Faults: Faults{Hang: true}}}, 1)[0]
	c := client(lp)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		_, err := c.Chat.Completions.New(ctx, openai.ChatCompletionNewParams{
			Model: testModel, Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage("hi")},
		})
		done <- err
	}()
	if _, err := lp.WaitFor(context.Background(), func(m Metrics) bool { return m.Waiting == 1 }); err != nil {
		t.Fatal(err)
	}
	cancel()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Errorf("client error %v, want context.Canceled", err)
	}
	m, err := lp.WaitFor(context.Background(), func(m Metrics) bool { return m.Waiting == 0 })
	if err != nil || m.Failures != 1 || m.RequestsOK != 0 {
		t.Errorf("after cancel: %+v, %v", m, err)
	}
	expired, stop := context.WithCancel(context.Background())
	stop()
	if _, err := lp.WaitFor(expired, func(Metrics) bool { return false }); !errors.Is(err, context.Canceled) {
		t.Errorf("WaitFor on a done context: %v", err)
	}
}

// TestLabelMetrics: with LabelMetrics, the pod's labels reach every
// series, so the seed dashboards' "by (pool)" queries work on a static
// scrape.
func TestLabelMetrics(t *testing.T) {
	f, err := ParseFleet([]byte("pools: [{name: big, profile: h100, count: 1, labels: {region: r1}}]"))
	if err != nil {
		t.Fatal(err)
	}
	pods, err := StartFleet(context.Background(), f, PodSpec{TimeScale: 1000, LabelMetrics: true})
	if err != nil {
		t.Fatal(err)
	}
	defer pods[0].Close()
	fams := scrapeFamilies(t, pods[0])
	for _, name := range []string{"vllm:num_requests_waiting", "vllm:time_to_first_token_seconds", "vllm:lora_requests_info"} {
		f := fams[name]
		if f == nil || len(f.Metric) == 0 {
			t.Fatalf("%s missing", name)
		}
		m := f.Metric[0]
		if label(m, "pool") != "big" || label(m, "gpu") != "h100" || label(m, "region") != "r1" || label(m, "pod") != "big-0" {
			t.Errorf("%s labels %v", name, m.GetLabel())
		}
	}
	bad, err := ParseFleet([]byte("pools: [{name: x, profile: h100, count: 1, labels: {app.kubernetes.io/name: x}}]"))
	if err != nil {
		t.Fatal(err)
	}
	if pods, err := StartFleet(context.Background(), bad, PodSpec{LabelMetrics: true}); err == nil {
		pods[0].Close()
		t.Error("a label name Prometheus rejects was accepted")
	}
}

// TestLiveRoleChunkComesWithFirstToken: a streamed chat answer sends its
// headers once the request is queued, but no event before the first
// token; vLLM emits the role chunk on the engine's first output. A proxy
// times the first body byte as the time to first token (Tier-1's latency
// model learns from it): with the role chunk sent at once, every pod
// looked as fast as a cached H100 to it. The pod is stopped while the
// request is hung before its first token, so whatever the client read
// was sent before any token.
func TestLiveRoleChunkComesWithFirstToken(t *testing.T) {
	lp := startLive(t, PodSpec{}, 1)[0]
	putFaults(t, lp, `{"hang":true}`)
	body := `{"model":"` + testModel + `","stream":true,"max_tokens":4,"messages":[{"role":"user","content":"hello"}]}`
	resp, err := http.Post(lp.URL()+"/v1/chat/completions", "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("status %s", resp.Status)
	}
	lp.Close()
	got, _ := io.ReadAll(resp.Body) // the connection drops: an error is expected
	if len(got) != 0 {
		t.Errorf("before the first token the stream sent %q, want nothing", got)
	}
}

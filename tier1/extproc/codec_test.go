package extproc

import (
	"bytes"
	"testing"

	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/proto"
)

// chunkResponse is the largest message the picker sends: a streamed body
// chunk of MaxChunk bytes.
func chunkResponse(fill byte) *extprocv3.ProcessingResponse {
	return &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_RequestBody{RequestBody: &extprocv3.BodyResponse{
		Response: &extprocv3.CommonResponse{BodyMutation: &extprocv3.BodyMutation{
			Mutation: &extprocv3.BodyMutation_StreamedResponse{StreamedResponse: &extprocv3.StreamedBodyResponse{
				Body: bytes.Repeat([]byte{fill}, MaxChunk)}}}}}}}
}

// TestCodecChunkBuffer: a body chunk is marshalled into a 64 KiB buffer,
// not gRPC's next tier of 1 MiB (zeroed whole on every reuse), and what
// the codec writes decodes to the same message.
func TestCodecChunkBuffer(t *testing.T) {
	msg := chunkResponse('x')
	data, err := codec{}.Marshal(msg)
	if err != nil {
		t.Fatal(err)
	}
	defer data.Free()
	if len(data) != 1 {
		t.Fatalf("marshalled into %d buffers, want 1", len(data))
	}
	b := data[0].ReadOnlyData()
	if len(b) != proto.Size(msg) {
		t.Fatalf("marshalled %d bytes, want %d", len(b), proto.Size(msg))
	}
	if c := cap(b); c > 64<<10 {
		t.Errorf("a %d-byte chunk went into a buffer of %d bytes, want at most 64 KiB", len(b), c)
	}
	var got extprocv3.ProcessingResponse
	if err := (codec{}).Unmarshal(data, &got); err != nil {
		t.Fatal(err)
	}
	if !proto.Equal(&got, msg) {
		t.Error("the chunk does not survive a round trip through the codec")
	}
}

// TestCodecReusedBufferIsClean: a buffer that goes back to the pool is
// zeroed before the next message uses it, so one request's bytes never
// show in another's (a shorter message marshalled after a longer one).
func TestCodecReusedBufferIsClean(t *testing.T) {
	for range 4 {
		data, err := codec{}.Marshal(chunkResponse('s'))
		if err != nil {
			t.Fatal(err)
		}
		data.Free()
	}
	buf := BufferPool().Get(40 << 10)
	defer BufferPool().Put(buf)
	if i := bytes.IndexByte((*buf)[:cap(*buf)], 's'); i >= 0 {
		t.Fatalf("a pooled buffer still holds an earlier message's byte at %d", i)
	}
}

// TestCodecRejectsNonProto: a value that is not a proto message is an
// error, not a panic.
func TestCodecRejectsNonProto(t *testing.T) {
	if _, err := (codec{}).Marshal(struct{}{}); err == nil {
		t.Error("marshalling a struct{}: no error")
	}
	if err := (codec{}).Unmarshal(mem.BufferSlice{mem.SliceBuffer([]byte{1})}, struct{}{}); err == nil {
		t.Error("unmarshalling into a struct{}: no error")
	}
}

package extproc

import (
	"fmt"
	"sync"

	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/proto"
)

// bufferPool is BufferPool's pool, built once.
var bufferPool = sync.OnceValue(func() mem.BufferPool {
	p, err := mem.NewBinaryTieredBufferPool(8, 12, 14, 15, 16, 20)
	if err != nil {
		panic(err) // the exponents are constants
	}
	return p
})

// BufferPool is the gRPC buffer pool of ext_proc streams: gRPC's default
// tiers (256 B, 4 KiB, 16 KiB, 32 KiB, 1 MiB) plus 64 KiB. A body chunk
// sent back is up to MaxChunk (62,000) bytes, so with the default tiers
// every chunk is marshalled into a 1 MiB buffer that the pool zeroes
// whole before each use: 4 MiB cleared for a 220 KB body, about 15% of
// the picker's CPU. The 64 KiB tier holds a chunk and is cleared in a
// sixteenth of the time. Buffers are still zeroed on reuse, as gRPC's
// own are, so no byte of one request can show in another's. A Go
// client that receives those chunks (the tests' Envoy) wants the same
// pool: experimental.WithBufferPool.
func BufferPool() mem.BufferPool { return bufferPool() }

// codec is gRPC's proto codec with BufferPool for its buffers. gRPC's own
// marshals into the process-wide default pool whatever pool the server
// was given (only experimental.SetDefaultBufferPool, a global set at
// init, changes it), so the server forces this one instead.
type codec struct{}

func (codec) Name() string { return "proto" }

func (codec) Marshal(v any) (mem.BufferSlice, error) {
	m, ok := v.(proto.Message)
	if !ok {
		return nil, fmt.Errorf("extproc: cannot marshal %T: not a proto message", v)
	}
	size := proto.Size(m)
	opts := proto.MarshalOptions{UseCachedSize: true} // Size just ran
	if mem.IsBelowBufferPoolingThreshold(size) {
		b, err := opts.Marshal(m)
		if err != nil {
			return nil, err
		}
		return mem.BufferSlice{mem.SliceBuffer(b)}, nil
	}
	pool := BufferPool()
	buf := pool.Get(size)
	if _, err := opts.MarshalAppend((*buf)[:0], m); err != nil {
		pool.Put(buf)
		return nil, err
	}
	return mem.BufferSlice{mem.NewBuffer(buf, pool)}, nil
}

func (codec) Unmarshal(data mem.BufferSlice, v any) error {
	m, ok := v.(proto.Message)
	if !ok {
		return fmt.Errorf("extproc: cannot unmarshal into %T: not a proto message", v)
	}
	buf := data.MaterializeToBuffer(BufferPool())
	defer buf.Free()
	return proto.Unmarshal(buf.ReadOnlyData(), m)
}

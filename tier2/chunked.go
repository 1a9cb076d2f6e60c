package tier2

import (
	"bytes"
	"errors"
	"strconv"
)

// chunkDecoder reads a chunked body (RFC 9112 §7.1) as its bytes arrive,
// in whatever pieces: the event loops have no reader to block on. A line
// (a chunk's size, a trailer) that has not arrived whole is left
// unconsumed for the next call.
type chunkDecoder struct {
	state int
	size  int64 // bytes left in the current chunk
}

const (
	chunkSize = iota
	chunkData
	chunkCR
	chunkLF
	chunkTrailer
	chunkDone
)

// maxChunkLine bounds a chunk-size or trailer line.
const maxChunkLine = 4096

var (
	errChunked       = errors.New("malformed chunked encoding")
	errChunkTooLarge = errors.New("chunked body longer than the limit")
)

// feed consumes what it can of b, passing chunk data to data (whose slice
// is b's: valid during the call). It reports the bytes consumed and
// whether the body ended (the last chunk and its trailers).
func (d *chunkDecoder) feed(b []byte, data func([]byte) error) (n int, done bool, err error) {
	for n < len(b) && d.state != chunkDone {
		switch d.state {
		case chunkSize, chunkTrailer:
			i := bytes.IndexByte(b[n:], '\n')
			if i < 0 {
				if len(b)-n > maxChunkLine {
					return n, false, errChunked
				}
				return n, false, nil
			}
			if i > maxChunkLine {
				return n, false, errChunked
			}
			line := bytes.TrimRight(b[n:n+i], "\r")
			n += i + 1
			if d.state == chunkTrailer {
				if len(line) == 0 {
					d.state = chunkDone
				}
				continue
			}
			if j := bytes.IndexByte(line, ';'); j >= 0 {
				line = line[:j] // extensions are ignored
			}
			line = bytes.TrimRight(line, " \t")
			if len(line) == 0 || len(line) > 15 {
				return n, false, errChunked
			}
			size, perr := strconv.ParseInt(string(line), 16, 64)
			if perr != nil || size < 0 {
				return n, false, errChunked
			}
			if size == 0 {
				d.state = chunkTrailer
			} else {
				d.size, d.state = size, chunkData
			}
		case chunkData:
			k := int(min(int64(len(b)-n), d.size))
			if err := data(b[n : n+k]); err != nil {
				return n, false, err
			}
			n += k
			if d.size -= int64(k); d.size == 0 {
				d.state = chunkCR
			}
		case chunkCR:
			switch b[n] {
			case '\r':
				d.state = chunkLF
			case '\n':
				d.state = chunkSize
			default:
				return n, false, errChunked
			}
			n++
		case chunkLF:
			if b[n] != '\n' {
				return n, false, errChunked
			}
			n++
			d.state = chunkSize
		}
	}
	return n, d.state == chunkDone, nil
}

// decode is feed appending the data to *out, at most limit bytes in all
// (errChunkTooLarge beyond).
func (d *chunkDecoder) decode(b []byte, out *[]byte, limit int64) (int, bool, error) {
	return d.feed(b, func(p []byte) error {
		if int64(len(*out)+len(p)) > limit {
			return errChunkTooLarge
		}
		*out = append(*out, p...)
		return nil
	})
}

package request

import "bytes"

// A Prescan decodes a body's long strings while the body is still
// arriving in chunks, so that ParseScanned, once the body is whole, takes
// them as they are instead of decoding them then: a long prompt is decoded
// as it streams in, and what is left when its last chunk arrives is the
// structure around it and the strings of that chunk.
//
// It only decodes: whether the body is valid JSON, and which strings
// matter, is ParseScanned's to say. A string it would need more than the
// fast decoder for (a surrogate pair, an invalid escape or UTF-8, a
// control character) it leaves to ParseScanned. The zero value is ready;
// Reset makes one reusable for another body.
type Prescan struct {
	pos   int  // next byte of the body to look at
	in    bool // inside a string
	slow  bool // the current string is left to ParseScanned
	esc   bool // slow: the byte at pos is escaped
	quote int  // offset of the current string's opening quote
	start int  // where its decoded bytes start in out
	out   []byte
	strs  []prescanned
	next  int // ParseScanned's cursor into strs
	// keepMin is the shortest decoded string kept; 0 means prescanMin.
	// (Tests keep every string, −1.)
	keepMin int
}

// prescanned is one string decoded ahead: the body's bytes from its
// opening quote to its closing one decode to out[off:off+n].
type prescanned struct{ quote, end, off, n int }

// prescanMin is the shortest decoded string kept: shorter ones cost
// ParseScanned about as much to decode again as to look up.
const prescanMin = 256

// Size is the capacity of p's buffer of decoded bytes (for pools that keep
// only buffers of usual sizes).
func (p *Prescan) Size() int { return cap(p.out) }

// Reset empties p for another body, keeping its buffers.
func (p *Prescan) Reset() {
	*p = Prescan{out: p.out[:0], strs: p.strs[:0], keepMin: p.keepMin}
}

// Feed looks at the body received so far, data: the bytes received before
// (as given to the last Feed) followed by the new ones.
func (p *Prescan) Feed(data []byte) {
	for p.pos < len(data) {
		switch {
		case !p.in:
			k := bytes.IndexByte(data[p.pos:], '"')
			if k < 0 {
				p.pos = len(data)
				return
			}
			p.quote = p.pos + k
			p.pos = p.quote + 1
			p.in, p.slow, p.esc, p.start = true, false, false, len(p.out)
		case p.slow:
			p.skipSlow(data)
		default:
			// decodeRun needs room in out for the rest of data. (Doubling:
			// out stays within twice the body's length.)
			if need := len(data) - p.pos; cap(p.out)-len(p.out) < need {
				grown := make([]byte, len(p.out), max(2*cap(p.out), len(p.out)+need))
				copy(grown, p.out)
				p.out = grown
			}
			out := p.out[:cap(p.out)]
			i, n, stop := decodeRun(data, p.pos, out, len(p.out))
			p.pos, p.out = i, out[:n]
			switch {
			case stop == stopQuote:
				p.pos++
				p.in = false
				if keep := p.keepMin; n-p.start >= keep && (keep != 0 || n-p.start >= prescanMin) {
					p.strs = append(p.strs, prescanned{quote: p.quote, end: i, off: p.start, n: n - p.start})
				} else {
					p.out = p.out[:p.start]
				}
			case stop == stopEnd || stop == stopSlow && len(data)-i < 12:
				// Wait for more: an escape (a surrogate pair takes 12
				// bytes) or a UTF-8 sequence may continue in the next chunk.
				return
			default:
				p.slow = true
				p.out = p.out[:p.start]
			}
		}
	}
}

// skipSlow moves pos past the current string's closing quote, or to the
// end of data, without decoding.
func (p *Prescan) skipSlow(data []byte) {
	for ; p.pos < len(data); p.pos++ {
		switch {
		case p.esc:
			p.esc = false
		case data[p.pos] == '\\':
			p.esc = true
		case data[p.pos] == '"':
			p.pos++
			p.in = false
			return
		}
	}
}

// take returns the decoded value of the string whose opening quote is at
// quote and the offset of its closing quote, if p decoded it.
func (p *Prescan) take(quote int) ([]byte, int, bool) {
	for p.next < len(p.strs) && p.strs[p.next].quote < quote {
		p.next++
	}
	if p.next == len(p.strs) || p.strs[p.next].quote != quote {
		return nil, 0, false
	}
	e := p.strs[p.next]
	p.next++
	return p.out[e.off : e.off+e.n], e.end, true
}

// ParseScanned is Parse for a body whose chunks were given to pre as they
// arrived (nil: Parse). The Body it returns is the one Parse returns, but
// for where its long strings are: they share pre's buffer, so pre must not
// be fed or Reset again while the Body is read (its Model and CacheSalt,
// which outlive Release, are copies).
func ParseScanned(data []byte, maxBytes int64, pre *Prescan) (*Body, error) {
	return ParseScannedAs(data, maxBytes, pre, 0)
}

// ParseScannedAs is ParseScanned for a body of the endpoint of kind
// (ReadSizedAs).
func ParseScannedAs(data []byte, maxBytes int64, pre *Prescan, kind Kind) (*Body, error) {
	if pre != nil {
		pre.next = 0
	}
	return parse(data, maxBytes, pre, kind)
}

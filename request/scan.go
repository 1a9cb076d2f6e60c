package request

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math/bits"
	"unicode/utf16"
	"unicode/utf8"
)

// maxDepth bounds the nesting of arrays and objects a body may have. Bodies
// of OpenAI requests nest a handful of levels; the bound keeps a hostile
// body from growing the stack without limit.
const maxDepth = 512

// plainByte marks the bytes a string's fast path passes over: printable
// ASCII other than the quote and the backslash.
var plainByte = func() (t [256]bool) {
	for c := 0x20; c < utf8.RuneSelf; c++ {
		t[c] = c != '"' && c != '\\'
	}
	return t
}()

// errSyntax is wrapped by every syntax error so callers can classify them
// as ErrMalformed without matching text.
var errSyntax = errors.New("invalid JSON")

// scanner walks a JSON document once, left to right. It validates what it
// skips, so a body that parses is valid JSON, and it decodes only the
// strings the caller asks for.
type scanner struct {
	b     []byte
	i     int
	depth int
	keys  []byte   // scratch for keys with escapes (rare)
	pre   *Prescan // strings decoded ahead, or nil
	// taken: the last string scanned is pre's (its bytes are pre's
	// buffer, which outlives the scan).
	taken bool
}

func (s *scanner) errorf(format string, args ...any) error {
	return fmt.Errorf("%w at byte %d: %s", errSyntax, s.i, fmt.Sprintf(format, args...))
}

func (s *scanner) ws() {
	for s.i < len(s.b) {
		switch s.b[s.i] {
		case ' ', '\t', '\n', '\r':
			s.i++
		default:
			return
		}
	}
}

// peek returns the next non-space byte without consuming it, or 0 at the
// end of input.
func (s *scanner) peek() byte {
	s.ws()
	if s.i >= len(s.b) {
		return 0
	}
	return s.b[s.i]
}

func (s *scanner) expect(c byte) error {
	if s.peek() != c {
		if s.i >= len(s.b) {
			return s.errorf("unexpected end of input, want %q", c)
		}
		return s.errorf("unexpected %q, want %q", s.b[s.i], c)
	}
	s.i++
	return nil
}

// object calls field for each member of the object at the cursor. field
// must consume the member's value.
func (s *scanner) object(field func(key []byte) error) error {
	if err := s.expect('{'); err != nil {
		return err
	}
	if s.depth++; s.depth > maxDepth {
		return s.errorf("nesting deeper than %d", maxDepth)
	}
	defer func() { s.depth-- }()
	if s.peek() == '}' {
		s.i++
		return nil
	}
	for {
		if s.peek() != '"' {
			return s.errorf("want an object key")
		}
		key, err := s.str(&s.keys)
		if err != nil {
			return err
		}
		if err := s.expect(':'); err != nil {
			return err
		}
		if err := field(key); err != nil {
			return err
		}
		switch s.peek() {
		case ',':
			s.i++
		case '}':
			s.i++
			return nil
		default:
			return s.errorf("want ',' or '}' after an object member")
		}
	}
}

// array calls elem for each element of the array at the cursor. elem must
// consume the element.
func (s *scanner) array(elem func() error) error {
	if err := s.expect('['); err != nil {
		return err
	}
	if s.depth++; s.depth > maxDepth {
		return s.errorf("nesting deeper than %d", maxDepth)
	}
	defer func() { s.depth-- }()
	if s.peek() == ']' {
		s.i++
		return nil
	}
	for {
		if err := elem(); err != nil {
			return err
		}
		switch s.peek() {
		case ',':
			s.i++
		case ']':
			s.i++
			return nil
		default:
			return s.errorf("want ',' or ']' after an array element")
		}
	}
}

// skip consumes and validates one value of any type.
func (s *scanner) skip() error {
	switch c := s.peek(); {
	case c == '{':
		return s.object(func([]byte) error { return s.skip() })
	case c == '[':
		return s.array(s.skip)
	case c == '"':
		return s.skipString()
	case c == '-' || (c >= '0' && c <= '9'):
		_, err := s.number()
		return err
	case c == 't':
		return s.literal("true")
	case c == 'f':
		return s.literal("false")
	case c == 'n':
		return s.literal("null")
	case c == 0 && s.i >= len(s.b):
		return s.errorf("unexpected end of input, want a value")
	default:
		return s.errorf("unexpected %q, want a value", c)
	}
}

func (s *scanner) literal(word string) error {
	s.ws()
	if len(s.b)-s.i < len(word) || string(s.b[s.i:s.i+len(word)]) != word {
		return s.errorf("invalid literal, want %s", word)
	}
	s.i += len(word)
	return nil
}

// boolean consumes true or false.
func (s *scanner) boolean() (bool, error) {
	switch s.peek() {
	case 't':
		return true, s.literal("true")
	case 'f':
		return false, s.literal("false")
	}
	return false, s.errorf("want true or false")
}

// number consumes a JSON number and returns its text.
func (s *scanner) number() ([]byte, error) {
	s.ws()
	start := s.i
	if s.i < len(s.b) && s.b[s.i] == '-' {
		s.i++
	}
	switch {
	case s.i < len(s.b) && s.b[s.i] == '0':
		s.i++
	case s.i < len(s.b) && s.b[s.i] >= '1' && s.b[s.i] <= '9':
		for s.i < len(s.b) && s.b[s.i] >= '0' && s.b[s.i] <= '9' {
			s.i++
		}
	default:
		return nil, s.errorf("invalid number")
	}
	if s.i < len(s.b) && s.b[s.i] == '.' {
		s.i++
		if !s.digits() {
			return nil, s.errorf("invalid number: want a digit after '.'")
		}
	}
	if s.i < len(s.b) && (s.b[s.i] == 'e' || s.b[s.i] == 'E') {
		s.i++
		if s.i < len(s.b) && (s.b[s.i] == '+' || s.b[s.i] == '-') {
			s.i++
		}
		if !s.digits() {
			return nil, s.errorf("invalid number: want a digit in the exponent")
		}
	}
	return s.b[start:s.i], nil
}

func (s *scanner) digits() bool {
	start := s.i
	for s.i < len(s.b) && s.b[s.i] >= '0' && s.b[s.i] <= '9' {
		s.i++
	}
	return s.i > start
}

// skipString validates the string at the cursor without decoding it.
func (s *scanner) skipString() error {
	_, _, err := s.scanString(nil, false)
	return err
}

// str decodes the string at the cursor. When the string is plain ASCII
// without escapes the result aliases the input; otherwise it is decoded
// into *scratch, which is grown as needed and reused by the next call.
// Either way the result is valid only until the next call: callers that
// keep the value must copy it.
func (s *scanner) str(scratch *[]byte) ([]byte, error) {
	v, decoded, err := s.scanString((*scratch)[:0], true)
	if decoded {
		*scratch = v[:0]
	}
	return v, err
}

// Masks for plainRun's eight-bytes-at-a-time test.
const (
	lsb    = 0x0101010101010101
	msb    = 0x8080808080808080
	quote  = '"' * lsb
	bslash = '\\' * lsb
	space  = 0x20 * lsb
)

// plainRun returns the index of the first byte at or after i that ends a
// string's plain run: a quote, a backslash, a control character or a
// non-ASCII byte; len(b) when there is none. It tests eight bytes at a
// time: a prompt is mostly plain text, and this loop is most of the
// parser's time.
func plainRun(b []byte, i int) int {
	for ; i+8 <= len(b); i += 8 {
		if m := plainMask(binary.LittleEndian.Uint64(b[i:])); m != 0 {
			return i + bits.TrailingZeros64(m)/8
		}
	}
	for ; i < len(b) && plainByte[b[i]]; i++ {
	}
	return i
}

// scanString consumes the string at the cursor. With decode, it returns the
// decoded value: a slice of the input (decoded false) or dst grown (decoded
// true).
func (s *scanner) scanString(dst []byte, decode bool) (v []byte, decoded bool, err error) {
	if err := s.expect('"'); err != nil {
		return nil, false, err
	}
	start := s.i
	if s.pre != nil {
		s.taken = false
		// Decoded as the body arrived: the value is pre's, as it would be
		// the input's had the string been plain.
		if v, end, ok := s.pre.take(start - 1); ok {
			s.i, s.taken = end+1, true
			return v, false, nil
		}
	}
	// A decoded string is never longer than its JSON text but where
	// invalid UTF-8 becomes U+FFFD; when dst has room for the rest of the
	// input (the parser's arena always has), decode as it scans, without
	// append's checks, leaving the rare cases to decodeString.
	if decode && cap(dst)-len(dst) >= len(s.b)-start {
		return s.decodeInto(dst)
	}
	// Fast path: plain ASCII without escapes.
	s.i = plainRun(s.b, s.i)
	if s.i < len(s.b) && s.b[s.i] == '"' {
		s.i++
		return s.b[start : s.i-1], false, nil
	}
	if !decode {
		return s.decodeString(nil, false)
	}
	return s.decodeString(append(dst, s.b[start:s.i]...), true)
}

// plainMask flags, in the high bit of each of x's eight bytes, the bytes
// that end a string's plain run (plainRun): non-ASCII (its own high bit),
// below 0x20 (x − 0x20 wraps), '"' or '\\' (zero after the XOR, so − 1
// wraps). A byte of a plain run sets none of them and borrows nothing from
// the byte above, so the lowest flag is exact; flags above it may be
// spurious.
func plainMask(x uint64) uint64 {
	return (x | (x - space) | ((x ^ quote) - lsb) | ((x ^ bslash) - lsb)) & msb
}

// decodeInto is scanString's decoding when dst has room for the input from
// the cursor on (decodeRun); what decodeRun leaves, decodeString finishes
// or reports.
func (s *scanner) decodeInto(dst []byte) (v []byte, decoded bool, err error) {
	out := dst[:cap(dst)]
	i, n, stop := decodeRun(s.b, s.i, out, len(dst))
	s.i = i
	switch stop {
	case stopQuote:
		s.i++
		return out[:n], true, nil
	case stopEnd:
		return nil, false, s.errorf("unterminated string")
	case stopControl:
		return nil, false, s.errorf("control character 0x%02x in string", s.b[i])
	}
	return s.decodeString(out[:n], true)
}

// Where decodeRun stopped.
type decodeStop uint8

const (
	stopQuote   decodeStop = iota // at the closing quote
	stopEnd                       // at the end of the input, the string open
	stopControl                   // at a control character (an error)
	// stopSlow: at what decodeString handles (a surrogate escape, an
	// invalid escape, a backslash or UTF-8 sequence cut by the end of the
	// input, invalid UTF-8, which decodes longer than it is).
	stopSlow
)

// decodeRun decodes the string text b[i:] into out from out[n:] until
// the closing quote or anything it leaves to decodeString, and returns
// where it stopped in b and the end of what it wrote. out must have room
// for b[i:] from n on (a decoded run is never longer than its JSON). It
// copies eight bytes at a time to out as it scans them (the bytes past the
// end of a plain run are overwritten by what follows, or lie past the
// result), so that plain text costs one load, one store and the test of
// plainMask per eight bytes, with no call per run.
func decodeRun(b []byte, i int, out []byte, n int) (int, int, decodeStop) {
	for {
		// Here out has room for b[i:] from n on: the second test only lets
		// the compiler drop the bounds checks. The loop walks src and to
		// (b[i:] and out[n:]) so that the compiler sees their lengths and
		// drops the bounds checks.
		if src, to := b[i:], out[n:]; len(src) >= 16 && len(to) >= 16 {
			for len(src) >= 16 && len(to) >= 16 {
				x, y := binary.LittleEndian.Uint64(src), binary.LittleEndian.Uint64(src[8:])
				binary.LittleEndian.PutUint64(to, x)
				binary.LittleEndian.PutUint64(to[8:], y)
				if mx, my := plainMask(x), plainMask(y); mx|my != 0 {
					// The first flagged byte: in x, else in y. Without a
					// branch (which word it is in is as likely one as the
					// other): kx is 8 exactly when mx is 0, and kx>>3 is
					// then 1.
					kx, ky := bits.TrailingZeros64(mx)>>3, bits.TrailingZeros64(my)>>3
					k := kx + ky&-(kx>>3)
					d := len(b) - len(src) + k - i
					i, n = i+d, n+d
					goto special
				}
				src, to = src[16:], to[16:]
			}
			d := len(b) - len(src) - i
			i, n = i+d, n+d
		}
		for i+8 <= len(b) && n+8 <= len(out) {
			x := binary.LittleEndian.Uint64(b[i:])
			binary.LittleEndian.PutUint64(out[n:], x)
			if m := plainMask(x); m != 0 {
				k := bits.TrailingZeros64(m) >> 3
				i, n = i+k, n+k
				goto special
			}
			i, n = i+8, n+8
		}
		for i < len(b) && n < len(out) && plainByte[b[i]] {
			out[n] = b[i]
			i, n = i+1, n+1
		}
	special:
		if i >= len(b) {
			return i, n, stopEnd
		}
		c := b[i]
		switch {
		case c == '"':
			return i, n, stopQuote
		case c == '\\' && i+1 < len(b):
			e := b[i+1]
			if d := unescaped[e]; d != 0 {
				out[n] = d
				n++
				i += 2
				continue
			}
			r, ok := rune(0), false
			if e == 'u' && i+6 <= len(b) {
				r, ok = hex4(b[i+2 : i+6])
			}
			if !ok || utf16.IsSurrogate(r) {
				return i, n, stopSlow // pairs and errors
			}
			// UTF-8 of a rune below 0x10000 that is not a surrogate, in
			// place: the six bytes of the escape leave room for it.
			switch {
			case r < utf8.RuneSelf:
				out[n] = byte(r)
				n++
			case r < 0x800:
				out[n], out[n+1] = 0xc0|byte(r>>6), 0x80|byte(r)&0x3f
				n += 2
			default:
				out[n], out[n+1], out[n+2] = 0xe0|byte(r>>12), 0x80|byte(r>>6)&0x3f, 0x80|byte(r)&0x3f
				n += 3
			}
			i += 6
		case c < 0x20:
			return i, n, stopControl
		case c < utf8.RuneSelf: // a lone backslash at the end
			return i, n, stopSlow
		default:
			r, size := utf8.DecodeRune(b[i:])
			if r == utf8.RuneError && size == 1 {
				return i, n, stopSlow // U+FFFD is longer
			}
			n += copy(out[n:], b[i:i+size])
			i += size
		}
	}
}

// decodeString consumes the rest of a string whose plain run the cursor
// ended, appending its decoded bytes to dst when decode is set.
func (s *scanner) decodeString(dst []byte, decode bool) (v []byte, decoded bool, err error) {
	for s.i < len(s.b) {
		c := s.b[s.i]
		switch {
		case c == '"':
			s.i++
			return dst, decode, nil
		case c < 0x20:
			return nil, false, s.errorf("control character 0x%02x in string", c)
		case c == '\\':
			r, err := s.escape()
			if err != nil {
				return nil, false, err
			}
			if decode {
				dst = utf8.AppendRune(dst, r)
			}
		case c < utf8.RuneSelf:
			run := plainRun(s.b, s.i+1)
			if decode {
				dst = append(dst, s.b[s.i:run]...)
			}
			s.i = run
		default:
			// Invalid UTF-8 becomes U+FFFD, as encoding/json decodes it.
			r, size := utf8.DecodeRune(s.b[s.i:])
			if decode {
				if r == utf8.RuneError && size == 1 {
					dst = utf8.AppendRune(dst, r)
				} else {
					dst = append(dst, s.b[s.i:s.i+size]...)
				}
			}
			s.i += size
			if s.i < len(s.b) && s.b[s.i] < utf8.RuneSelf {
				run := plainRun(s.b, s.i)
				if decode {
					dst = append(dst, s.b[s.i:run]...)
				}
				s.i = run
			}
		}
	}
	return nil, false, s.errorf("unterminated string")
}

// escape consumes one backslash escape and returns the rune it stands for.
func (s *scanner) escape() (rune, error) {
	if s.i+1 >= len(s.b) {
		return 0, s.errorf("unterminated escape")
	}
	c := s.b[s.i+1]
	s.i += 2
	switch c {
	case '"', '\\', '/':
		return rune(c), nil
	case 'b':
		return '\b', nil
	case 'f':
		return '\f', nil
	case 'n':
		return '\n', nil
	case 'r':
		return '\r', nil
	case 't':
		return '\t', nil
	case 'u':
		r, ok := s.hex4()
		if !ok {
			return 0, s.errorf("invalid \\u escape")
		}
		if utf16.IsSurrogate(r) {
			// A high surrogate followed by a low one is one rune; anything
			// else is U+FFFD, as encoding/json decodes it.
			if s.i+1 < len(s.b) && s.b[s.i] == '\\' && s.b[s.i+1] == 'u' {
				save := s.i
				s.i += 2
				if r2, ok := s.hex4(); ok {
					if dec := utf16.DecodeRune(r, r2); dec != utf8.RuneError {
						return dec, nil
					}
				}
				s.i = save
			}
			return utf8.RuneError, nil
		}
		return r, nil
	}
	s.i--
	return 0, s.errorf("invalid escape '\\%c'", c)
}

func (s *scanner) hex4() (rune, bool) {
	if len(s.b)-s.i < 4 {
		return 0, false
	}
	r, ok := hex4(s.b[s.i : s.i+4])
	if ok {
		s.i += 4
	}
	return r, ok
}

// hex4 decodes four hexadecimal digits.
func hex4(b []byte) (rune, bool) {
	_ = b[3]
	a, c, d, e := hexDigit[b[0]], hexDigit[b[1]], hexDigit[b[2]], hexDigit[b[3]]
	if a|c|d|e < 0 {
		return 0, false
	}
	return rune(a)<<12 | rune(c)<<8 | rune(d)<<4 | rune(e), true
}

// hexDigit is a hexadecimal digit's value, −1 for other bytes.
var hexDigit = func() (t [256]int8) {
	for i := range t {
		t[i] = -1
	}
	for i := range 10 {
		t['0'+i] = int8(i)
	}
	for i := range 6 {
		t['a'+i], t['A'+i] = int8(10+i), int8(10+i)
	}
	return t
}()

// unescaped is the byte a one-character escape stands for (\n: '\n'), 0
// for the others (\u and invalid ones).
var unescaped = [256]byte{'"': '"', '\\': '\\', '/': '/', 'b': '\b', 'f': '\f', 'n': '\n', 'r': '\r', 't': '\t'}

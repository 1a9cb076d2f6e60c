package tier2

import "bytes"

// streamAccount counts the tokens a stream relayed to its caller, from
// the events as they pass: the cumulative usage vLLM puts in every chunk
// when asked for continuous_usage_stats, the final usage chunk, and, from
// an upstream that sends neither, one token per chunk with text (vLLM
// sends one token a chunk). Only events written to the caller count:
// a stream cut by the caller is charged what reached it.
//
// A Response stream (responses) has no per-chunk usage: its
// response.completed event (or response.incomplete, response.failed)
// carries the final usage as input_tokens and output_tokens, and each
// response.output_text.delta event before it counts one token.
type streamAccount struct {
	responses  bool
	prompt     int64 // usage.prompt_tokens last seen; 0: unknown
	completion int64 // cumulative usage.completion_tokens of the last relayed chunk
	chunks     int64 // relayed chunks with text and no usage
	total      int64 // usage.total_tokens of the final usage chunk
}

// streamEvent is what one event adds to the account once relayed.
type streamEvent struct {
	usage usage
	final bool // the final usage chunk (no choices)
	text  bool // a chunk with text and no usage
	drop  bool // not relayed: usage the caller did not ask for
}

type usage struct {
	prompt, completion, total int64
	ok                        bool
}

// read inspects one "data: {" line. It returns the line to relay (the
// per-chunk usage removed when hideContinuous) and what it adds.
func (a *streamAccount) read(line []byte, hideFinal, hideContinuous bool) ([]byte, streamEvent) {
	var ev streamEvent
	u, start, end, ok := findUsage(line)
	if a.responses {
		if ok {
			ev.usage, ev.final = u, true
		} else {
			ev.text = indexKey(line, textDelta) >= 0
		}
		return line, ev
	}
	if !ok {
		ev.text = hasText(line)
		return line, ev
	}
	ev.usage = u
	// vLLM and the simulator put "choices" first; anything else is
	// searched for.
	if rest, ok := bytes.CutPrefix(line, []byte(`data: {"choices":[`)); ok && len(rest) > 0 {
		ev.final = rest[0] == ']'
	} else {
		ev.final = indexKey(line, emptyChoices) >= 0
	}
	switch {
	case ev.final:
		ev.drop = hideFinal
	case hideContinuous:
		line = cutMember(line, start, end)
	}
	return line, ev
}

// commit adds a relayed (or deliberately dropped) event.
func (a *streamAccount) commit(ev streamEvent) {
	switch {
	case ev.usage.ok && ev.final:
		a.total = ev.usage.total
		a.prompt = ev.usage.prompt
		a.completion = max(a.completion, ev.usage.completion)
	case ev.usage.ok:
		a.prompt = ev.usage.prompt
		a.completion = max(a.completion, ev.usage.completion)
	case ev.text:
		a.chunks++
	}
}

// tokens is the stream's charge: the final usage when the stream got that
// far, otherwise the prompt (as reported, or estimated) plus the output
// relayed.
func (a *streamAccount) tokens(c *call) int64 {
	if a.total > 0 {
		return a.total
	}
	prompt := a.prompt
	if prompt == 0 {
		prompt = c.promptTokens
	}
	return prompt + a.completion + a.chunks
}

// findUsage finds a non-null "usage" object in an event or response JSON
// without decoding it (this runs on every chunk), and returns its counts
// and the byte range of the member ("usage":{...}). Model output cannot
// forge it: inside a JSON string a quote is escaped, so `"usage"` only
// matches a key.
func findUsage(b []byte) (u usage, start, end int, ok bool) {
	// The last "usage" member counts (as for a JSON decoder).
	i := indexKey(b, usageKey)
	if i < 0 {
		return u, 0, 0, false
	}
	for {
		k := indexKey(b[i+1:], usageKey)
		if k < 0 {
			break
		}
		i += 1 + k
	}
	j := i + len(`"usage"`)
	j = skipSpace(b, j)
	if j >= len(b) || b[j] != ':' {
		return u, 0, 0, false
	}
	j = skipSpace(b, j+1)
	if j >= len(b) || b[j] != '{' {
		return u, 0, 0, false // null
	}
	u, e := usageObject(b, j)
	if e < 0 {
		return usage{}, 0, 0, false
	}
	if u.total == 0 {
		u.total = u.prompt + u.completion
	}
	return u, i, e, true
}

var (
	usageKey     = []byte(`"usage"`)
	emptyChoices = []byte(`"choices":[]`)
	textDelta    = []byte(`"type":"response.output_text.delta"`)
)

// usageObject reads the usage object starting at b[i] ('{') in one pass
// over its members: the three counts (a Response's input_tokens and
// output_tokens where prompt_tokens and completion_tokens are absent) (non-negative integers, bounded so
// that they cannot overflow; anything else counts 0) and the index after
// the object, or -1 when it does not end.
func usageObject(b []byte, i int) (u usage, end int) {
	u.ok = true
	var input, output int64
	var hasPrompt, hasCompletion bool
	i++
	for {
		i = skipSpace(b, i)
		if i >= len(b) {
			return u, -1
		}
		switch b[i] {
		case '}':
			if !hasPrompt {
				u.prompt = input
			}
			if !hasCompletion {
				u.completion = output
			}
			return u, i + 1
		case ',':
			i++
			continue
		case '"':
		default:
			return u, -1
		}
		k := stringEnd(b, i)
		if k < 0 {
			return u, -1
		}
		key := b[i+1 : k-1]
		i = skipSpace(b, k)
		if i >= len(b) || b[i] != ':' {
			return u, -1
		}
		i = skipSpace(b, i+1)
		if i >= len(b) {
			return u, -1
		}
		var dst *int64
		switch string(key) {
		case "prompt_tokens":
			dst, hasPrompt = &u.prompt, true
		case "completion_tokens":
			dst, hasCompletion = &u.completion, true
		case "input_tokens": // a Response's, read when prompt_tokens is absent
			dst = &input
		case "output_tokens":
			dst = &output
		case "total_tokens":
			dst = &u.total
		}
		switch c := b[i]; {
		case c >= '0' && c <= '9':
			var n int64
			for ; i < len(b) && b[i] >= '0' && b[i] <= '9'; i++ {
				if n <= (1<<62)/10 {
					n = n*10 + int64(b[i]-'0')
				} else {
					n = 1 << 62
				}
			}
			if dst != nil {
				*dst = n
			}
			i = valueEnd(b, i) // a fraction or exponent: the integer part counts
		case c == '{' || c == '[':
			if i = objectEnd(b, i); i < 0 {
				return u, -1
			}
		case c == '"':
			if i = stringEnd(b, i); i < 0 {
				return u, -1
			}
		default: // a literal or a negative number: counts 0
			i = valueEnd(b, i)
		}
	}
}

// indexKey is bytes.Index(b, key) for a key that starts with a quote. It
// searches for the key without its quote, then checks the quote: JSON is
// full of quotes, and bytes.Index tries a candidate at each occurrence of
// the needle's first byte (an event took 80 ns with the quote first, 11
// without).
func indexKey(b, key []byte) int {
	for off := 0; ; {
		i := bytes.Index(b[off:], key[1:])
		if i < 0 {
			return -1
		}
		if i += off; i > 0 && b[i-1] == '"' {
			return i - 1
		}
		off = i + 1
	}
}

func skipSpace(b []byte, i int) int {
	for i < len(b) && (b[i] == ' ' || b[i] == '\t' || b[i] == '\r' || b[i] == '\n') {
		i++
	}
	return i
}

// valueEnd returns the index of the ',' or '}' after a scalar at b[i].
func valueEnd(b []byte, i int) int {
	for i < len(b) && b[i] != ',' && b[i] != '}' {
		i++
	}
	return i
}

// stringEnd returns the index after the string starting at b[i], or -1.
func stringEnd(b []byte, i int) int {
	for i++; i < len(b); i++ {
		switch b[i] {
		case '\\':
			i++
		case '"':
			return i + 1
		}
	}
	return -1
}

// objectEnd returns the index after the object starting at b[i], or -1.
func objectEnd(b []byte, i int) int {
	depth, inStr := 0, false
	for ; i < len(b); i++ {
		c := b[i]
		switch {
		case inStr && c == '\\':
			i++
		case c == '"':
			inStr = !inStr
		case inStr:
		case c == '{' || c == '[':
			depth++
		case c == '}' || c == ']':
			if depth--; depth == 0 {
				return i + 1
			}
		}
	}
	return -1
}

// cutMember removes the member b[start:end] from its object with the comma
// that separates it from a neighbour, in place.
func cutMember(b []byte, start, end int) []byte {
	k := start - 1
	for k >= 0 && (b[k] == ' ' || b[k] == '\t') {
		k--
	}
	switch {
	case k >= 0 && b[k] == ',':
		start = k
	default:
		e := skipSpace(b, end)
		if e < len(b) && b[e] == ',' {
			end = e + 1
		}
	}
	return b[:start+copy(b[start:], b[end:])]
}

// hasText reports whether a chunk carries output text: a non-empty
// "content" (chat) or "text" (completions) string.
func hasText(b []byte) bool {
	for _, key := range textKeys {
		if i := indexKey(b, key); i >= 0 && i+len(key) < len(b) && b[i+len(key)] != '"' {
			return true
		}
	}
	return false
}

var textKeys = [][]byte{[]byte(`"content":"`), []byte(`"text":"`)}

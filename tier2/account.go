package tier2

import "bytes"

// streamAccount counts the tokens a stream relayed to its caller, from
// the events as they pass: the cumulative usage vLLM puts in every chunk
// when asked for continuous_usage_stats, the final usage chunk, and, from
// an upstream that sends neither, one token per chunk with text (vLLM
// sends one token a chunk). Only events written to the caller count:
// a stream cut by the caller is charged what reached it.
type streamAccount struct {
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
	if !ok {
		ev.text = hasText(line)
		return line, ev
	}
	ev.usage = u
	ev.final = bytes.Contains(line, []byte(`"choices":[]`))
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
	if prompt == 0 && c.body != nil {
		prompt = int64(c.body.EstimateTokens())
	}
	return prompt + a.completion + a.chunks
}

// findUsage finds a non-null "usage" object in an event or response JSON
// without decoding it (this runs on every chunk), and returns its counts
// and the byte range of the member ("usage":{...}). Model output cannot
// forge it: inside a JSON string a quote is escaped, so `"usage"` only
// matches a key.
func findUsage(b []byte) (u usage, start, end int, ok bool) {
	// Index first: it is vectorised and most events carry no usage;
	// LastIndex (a byte-wise scan) only finds the last of several.
	i := bytes.Index(b, usageKey)
	if i < 0 {
		return u, 0, 0, false
	}
	if k := bytes.LastIndex(b[i+1:], usageKey); k >= 0 {
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
	e := objectEnd(b, j)
	if e < 0 {
		return u, 0, 0, false
	}
	obj := b[j:e]
	u = usage{prompt: intField(obj, `"prompt_tokens"`), completion: intField(obj, `"completion_tokens"`),
		total: intField(obj, `"total_tokens"`), ok: true}
	if u.total == 0 {
		u.total = u.prompt + u.completion
	}
	return u, i, e, true
}

var usageKey = []byte(`"usage"`)

func skipSpace(b []byte, i int) int {
	for i < len(b) && (b[i] == ' ' || b[i] == '\t' || b[i] == '\r' || b[i] == '\n') {
		i++
	}
	return i
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

// intField reads a non-negative integer member of a flat object, bounded
// so that it cannot overflow.
func intField(obj []byte, key string) int64 {
	i := bytes.Index(obj, []byte(key))
	if i < 0 {
		return 0
	}
	k := skipSpace(obj, i+len(key))
	if k >= len(obj) || obj[k] != ':' {
		return 0
	}
	k = skipSpace(obj, k+1)
	var n int64
	for ; k < len(obj) && obj[k] >= '0' && obj[k] <= '9'; k++ {
		if n > (1<<62)/10 {
			return 1 << 62
		}
		n = n*10 + int64(obj[k]-'0')
	}
	return n
}

// cutMember removes the member b[start:end] from its object with the comma
// that separates it from a neighbour.
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
	return append(b[:start:start], b[end:]...)
}

// hasText reports whether a chunk carries output text: a non-empty
// "content" (chat) or "text" (completions) string.
func hasText(b []byte) bool {
	for _, key := range [][]byte{[]byte(`"content":"`), []byte(`"text":"`)} {
		if i := bytes.Index(b, key); i >= 0 && i+len(key) < len(b) && b[i+len(key)] != '"' {
			return true
		}
	}
	return false
}

package request

import (
	"unicode/utf8"
)

// Separators of the canonical chat text. They are ASCII control characters
// that JSON strings in practice never carry unescaped in prompts, so message
// boundaries cannot be forged by content.
const (
	roleEnd    = 0x1f // unit separator: ends a role
	partMark   = 0x1d // group separator: starts a non-text part
	messageEnd = 0x1e // record separator: ends a message
)

// AppendPromptText appends the prompt as Meridian hashes it and returns the
// extended buffer. A completion's text prompt is itself. A chat is its
// messages in order, each as role, 0x1f, content, 0x1e, where an array
// content is its text parts in order and each other part as 0x1d, type,
// ':', url. Unlike the JSON of the messages, this text is the same however
// the client spelled the JSON (key order, spacing, escapes, a string or a
// single text part), just as the model server's chat template renders the
// same tokens for all those spellings. Token-id prompts have no text;
// hash them with TokenBlockHashes.
func AppendPromptText(dst []byte, b *Body) []byte {
	switch b.Kind {
	case Completion:
		return append(dst, b.Prompt...)
	case Embedding:
		// A batch's inputs in order, each ended as a message is.
		dst = append(dst, b.Prompt...)
		for _, s := range b.Inputs {
			dst = append(dst, s...)
			dst = append(dst, messageEnd)
		}
		return dst
	case Chat, Response:
		for i := range b.Messages {
			m := &b.Messages[i]
			dst = append(dst, m.Role...)
			dst = append(dst, roleEnd)
			if m.Parts == nil {
				dst = append(dst, m.Content...)
			}
			for j := range m.Parts {
				p := &m.Parts[j]
				if p.IsText() {
					dst = append(dst, p.Text...)
					continue
				}
				dst = append(dst, partMark)
				dst = append(dst, p.Type...)
				dst = append(dst, ':')
				dst = append(dst, p.ImageURL...)
			}
			dst = append(dst, messageEnd)
		}
	}
	return dst
}

// IsText reports whether a content part is text: a chat's "text" part, a
// Response's "input_text", or a part with text and no type.
func (p *Part) IsText() bool {
	return p.Type == "text" || p.Type == "input_text" || (p.Type == "" && p.Text != "")
}

// AppendPromptHead appends the first limit bytes of the prompt text
// AppendPromptText appends, without building the rest of a long prompt.
func AppendPromptHead(dst []byte, b *Body, limit int) []byte {
	start := len(dst)
	switch b.Kind {
	case Completion:
		return append(dst, b.Prompt[:min(len(b.Prompt), max(limit, 0))]...)
	case Embedding:
		dst = append(dst, b.Prompt[:min(len(b.Prompt), max(limit, 0))]...)
		for _, s := range b.Inputs {
			room := limit - (len(dst) - start)
			if room <= 0 {
				break
			}
			dst = append(dst, s[:min(len(s), room)]...)
			dst = append(dst, messageEnd)
		}
	case Chat, Response:
		for i := range b.Messages {
			room := limit - (len(dst) - start)
			if room <= 0 {
				break
			}
			one := [1]Message{b.Messages[i]}
			if one[0].Parts == nil && len(one[0].Content) > room {
				// Content is copied verbatim after the role, so its head
				// is the head of the message's text.
				one[0].Content = one[0].Content[:room]
			}
			dst = AppendPromptText(dst, &Body{Kind: Chat, Messages: one[:]})
		}
	}
	if len(dst)-start > limit {
		dst = dst[:start+max(limit, 0)]
	}
	return dst
}

// AppendGIEPrompt appends the prompt as the Gateway API Inference
// Extension's prefix-cache scorer hashes it: a completion's prompt string,
// or for a chat the output of Go's encoding/json for GIE's message type
// (role omitted when empty; content a JSON string, or an array of
// {"type","text" (omitted when empty),"image_url":{"url" (omitted when
// empty)}} parts). GIE cannot read token-id prompts; they append nothing.
// One difference remains: encoding/json also matches keys spelled in
// another case ("Content"), which Parse, like vLLM, ignores.
func AppendGIEPrompt(dst []byte, b *Body) []byte {
	switch b.Kind {
	case Completion, Embedding:
		return append(dst, b.Prompt...)
	case Chat, Response:
		dst = append(dst, '[')
		for i := range b.Messages {
			m := &b.Messages[i]
			if i > 0 {
				dst = append(dst, ',')
			}
			dst = append(dst, '{')
			if m.Role != "" {
				dst = append(dst, `"role":`...)
				dst = appendJSONString(dst, m.Role)
				dst = append(dst, ',')
			}
			dst = append(dst, `"content":`...)
			switch {
			case m.Content != "":
				dst = appendJSONString(dst, m.Content)
			case m.Parts != nil:
				dst = append(dst, '[')
				for j := range m.Parts {
					p := &m.Parts[j]
					if j > 0 {
						dst = append(dst, ',')
					}
					dst = append(dst, `{"type":`...)
					dst = appendJSONString(dst, p.Type)
					if p.Text != "" {
						dst = append(dst, `,"text":`...)
						dst = appendJSONString(dst, p.Text)
					}
					dst = append(dst, `,"image_url":{`...)
					if p.ImageURL != "" {
						dst = append(dst, `"url":`...)
						dst = appendJSONString(dst, p.ImageURL)
					}
					dst = append(dst, "}}"...)
				}
				dst = append(dst, ']')
			default:
				dst = append(dst, `""`...)
			}
			dst = append(dst, '}')
		}
		dst = append(dst, ']')
	}
	return dst
}

const hexDigits = "0123456789abcdef"

// appendJSONString appends s as encoding/json.Marshal writes a string:
// HTML-escaped, invalid UTF-8 as \ufffd, U+2028 and U+2029 escaped.
func appendJSONString(dst []byte, s string) []byte {
	dst = append(dst, '"')
	start := 0
	for i := 0; i < len(s); {
		if c := s[i]; c < utf8.RuneSelf {
			if c >= 0x20 && c != '"' && c != '\\' && c != '<' && c != '>' && c != '&' {
				i++
				continue
			}
			dst = append(dst, s[start:i]...)
			switch c {
			case '\\', '"':
				dst = append(dst, '\\', c)
			case '\b':
				dst = append(dst, '\\', 'b')
			case '\f':
				dst = append(dst, '\\', 'f')
			case '\n':
				dst = append(dst, '\\', 'n')
			case '\r':
				dst = append(dst, '\\', 'r')
			case '\t':
				dst = append(dst, '\\', 't')
			default:
				dst = append(dst, '\\', 'u', '0', '0', hexDigits[c>>4], hexDigits[c&0xf])
			}
			i++
			start = i
			continue
		}
		r, size := utf8.DecodeRuneInString(s[i:])
		if r == utf8.RuneError && size == 1 {
			dst = append(dst, s[start:i]...)
			dst = append(dst, `\ufffd`...)
			i++
			start = i
			continue
		}
		if r == '\u2028' || r == '\u2029' {
			dst = append(dst, s[start:i]...)
			dst = append(dst, '\\', 'u', '2', '0', '2', hexDigits[r&0xf])
			i += size
			start = i
			continue
		}
		i += size
	}
	dst = append(dst, s[start:]...)
	return append(dst, '"')
}

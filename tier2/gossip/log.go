package gossip

import (
	"bytes"
	"context"
	"io"
	"log"
	"log/slog"
)

// newLogBridge turns memberlist's "[LEVEL] memberlist: text" lines into
// slog records at the matching level. A nil logger discards them.
func newLogBridge(l *slog.Logger) *log.Logger {
	if l == nil {
		return log.New(io.Discard, "", 0)
	}
	return log.New(logBridge{l}, "", 0)
}

type logBridge struct{ l *slog.Logger }

var levelTags = []struct {
	tag   []byte
	level slog.Level
}{
	{[]byte("[DEBUG]"), slog.LevelDebug},
	{[]byte("[INFO]"), slog.LevelInfo},
	{[]byte("[WARN]"), slog.LevelWarn},
	{[]byte("[ERR]"), slog.LevelError},
	{[]byte("[ERROR]"), slog.LevelError},
}

func (b logBridge) Write(p []byte) (int, error) {
	line := bytes.TrimSpace(p)
	level := slog.LevelInfo
	for _, t := range levelTags {
		if bytes.HasPrefix(line, t.tag) {
			level = t.level
			line = bytes.TrimSpace(line[len(t.tag):])
			break
		}
	}
	if b.l.Enabled(context.Background(), level) {
		b.l.Log(context.Background(), level, string(line), "component", "memberlist")
	}
	return len(p), nil
}

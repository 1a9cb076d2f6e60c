package gossip

import (
	"encoding/binary"
	"errors"
	"fmt"
)

// Wire formats. Every message starts with a kind byte so a later version
// can change the layout and an old node can recognise what it cannot read.
//
//	broadcast: kindBroadcast, channel, flags, uvarint len(origin), origin,
//	           uvarint seq, [uvarint len(key), key if flagKeyed], payload
//	state:     kindState, uvarint len(origin), origin, uvarint n,
//	           n × (channel, uvarint len, bytes)
//	meta:      kindMeta, uvarint len(region), region
const (
	kindBroadcast byte = 0xB1
	kindState     byte = 0x51
	kindMeta      byte = 0x4D

	flagKeyed byte = 1
)

var errMalformed = errors.New("gossip: malformed message")

type broadcastMsg struct {
	channel byte
	keyed   bool
	origin  string
	seq     uint64
	key     string
	payload []byte
}

func appendBroadcast(b []byte, m *broadcastMsg) []byte {
	var flags byte
	if m.keyed {
		flags |= flagKeyed
	}
	b = append(b, kindBroadcast, m.channel, flags)
	b = appendString(b, m.origin)
	b = binary.AppendUvarint(b, m.seq)
	if m.keyed {
		b = appendString(b, m.key)
	}
	return append(b, m.payload...)
}

// decodeBroadcast parses buf; the payload aliases buf.
func decodeBroadcast(buf []byte) (broadcastMsg, error) {
	var m broadcastMsg
	if len(buf) < 3 || buf[0] != kindBroadcast {
		return m, errMalformed
	}
	m.channel, m.keyed = buf[1], buf[2]&flagKeyed != 0
	rest := buf[3:]
	var err error
	if m.origin, rest, err = readString(rest); err != nil {
		return m, err
	}
	seq, n := binary.Uvarint(rest)
	if n <= 0 {
		return m, errMalformed
	}
	m.seq, rest = seq, rest[n:]
	if m.keyed {
		if m.key, rest, err = readString(rest); err != nil {
			return m, err
		}
	}
	m.payload = rest
	return m, nil
}

type stateEntry struct {
	channel byte
	state   []byte
}

func appendState(b []byte, origin string, entries []stateEntry) []byte {
	b = append(b, kindState)
	b = appendString(b, origin)
	b = binary.AppendUvarint(b, uint64(len(entries)))
	for _, e := range entries {
		b = append(b, e.channel)
		b = binary.AppendUvarint(b, uint64(len(e.state)))
		b = append(b, e.state...)
	}
	return b
}

// decodeState parses buf; the entries alias buf.
func decodeState(buf []byte) (origin string, entries []stateEntry, err error) {
	if len(buf) < 1 || buf[0] != kindState {
		return "", nil, errMalformed
	}
	rest := buf[1:]
	if origin, rest, err = readString(rest); err != nil {
		return "", nil, err
	}
	n, k := binary.Uvarint(rest)
	if k <= 0 || n > 256 {
		return "", nil, errMalformed
	}
	rest = rest[k:]
	entries = make([]stateEntry, 0, n)
	for range n {
		if len(rest) < 1 {
			return "", nil, errMalformed
		}
		id := rest[0]
		l, k := binary.Uvarint(rest[1:])
		if k <= 0 || l > uint64(len(rest)-1-k) {
			return "", nil, errMalformed
		}
		start := 1 + k
		entries = append(entries, stateEntry{id, rest[start : start+int(l) : start+int(l)]})
		rest = rest[start+int(l):]
	}
	return origin, entries, nil
}

func encodeMeta(region string) []byte {
	return appendString([]byte{kindMeta}, region)
}

func decodeMeta(buf []byte) (region string, err error) {
	if len(buf) == 0 {
		return "", nil // a member that sent no metadata
	}
	if buf[0] != kindMeta {
		return "", fmt.Errorf("gossip: node metadata kind %#x: %w", buf[0], errMalformed)
	}
	region, _, err = readString(buf[1:])
	return region, err
}

func appendString(b []byte, s string) []byte {
	b = binary.AppendUvarint(b, uint64(len(s)))
	return append(b, s...)
}

func readString(b []byte) (string, []byte, error) {
	l, n := binary.Uvarint(b)
	if n <= 0 || l > uint64(len(b)-n) {
		return "", nil, errMalformed
	}
	end := n + int(l)
	return string(b[n:end]), b[end:], nil
}

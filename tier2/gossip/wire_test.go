package gossip

import (
	"bytes"
	"testing"

	"github.com/hashicorp/memberlist"
)

func TestWireRoundTrip(t *testing.T) {
	in := broadcastMsg{channel: 3, keyed: true, origin: "t2-a", seq: 1<<40 + 7, key: "pool/llama", payload: []byte("digest")}
	out, err := decodeBroadcast(appendBroadcast(nil, &in))
	if err != nil {
		t.Fatal(err)
	}
	if out.channel != in.channel || out.keyed != in.keyed || out.origin != in.origin || out.seq != in.seq ||
		out.key != in.key || !bytes.Equal(out.payload, in.payload) {
		t.Errorf("round trip: got %+v, want %+v", out, in)
	}

	origin, entries, err := decodeState(appendState(nil, "t2-b", []stateEntry{{1, []byte("x")}, {2, nil}}))
	if err != nil || origin != "t2-b" || len(entries) != 2 || string(entries[0].state) != "x" || entries[1].channel != 2 {
		t.Errorf("state round trip: %q %+v %v", origin, entries, err)
	}

	region, err := decodeMeta(encodeMeta("eu-west-1"))
	if err != nil || region != "eu-west-1" {
		t.Errorf("meta round trip: %q %v", region, err)
	}
}

// FuzzDecode feeds arbitrary bytes to every decoder: a peer may send
// anything, and no input may panic.
func FuzzDecode(f *testing.F) {
	f.Add(appendBroadcast(nil, &broadcastMsg{channel: 1, origin: "a", seq: 9, payload: []byte("p")}))
	f.Add(appendState(nil, "a", []stateEntry{{1, []byte("s")}}))
	f.Add(encodeMeta("r"))
	f.Add([]byte{kindState, 1, 'a', 0xff, 0xff, 0xff, 0xff, 0x0f})
	f.Fuzz(func(t *testing.T, b []byte) {
		_, _ = decodeBroadcast(b)
		_, _, _ = decodeState(b)
		_, _ = decodeMeta(b)
	})
}

func TestKeyedRelayDropsOlder(t *testing.T) {
	n := &Node{cfg: Config{Name: "self"}, latest: map[string]uint64{}}
	n.queue = newTestQueue()
	newer := broadcastMsg{channel: 1, keyed: true, origin: "peer", seq: 10, key: "k"}
	older := newer
	older.seq = 9
	if !n.enqueue(appendBroadcast(nil, &newer), &newer) {
		t.Fatal("newer payload not queued")
	}
	if n.enqueue(appendBroadcast(nil, &older), &older) {
		t.Error("an older payload for the same key was queued after a newer one")
	}
	if got := n.queue.NumQueued(); got != 1 {
		t.Errorf("queued %d, want 1", got)
	}
	newest := newer
	newest.seq = 11
	n.enqueue(appendBroadcast(nil, &newest), &newest)
	if got := n.queue.NumQueued(); got != 1 {
		t.Errorf("after a newer payload for the key: queued %d, want 1 (replaced)", got)
	}
}

func newTestQueue() *memberlist.TransmitLimitedQueue {
	return &memberlist.TransmitLimitedQueue{RetransmitMult: 3, NumNodes: func() int { return 5 }}
}

package regions

import (
	"errors"
	"math"
	"reflect"
	"strings"
	"testing"
	"testing/synctest"
	"time"
)

func sampleDigest() Digest {
	return Digest{
		Region: "us-east-1", Cluster: "use1-a", Pool: "llama-pool", Model: "meta-llama/Llama-3.1-8B-Instruct",
		Adapters:  []string{"support-bot", "sql-gen"},
		ReadyPods: 8, TotalPods: 10, QueueTotal: 17, QueueMax: 5, QueueMin: 0,
		KVMean: 0.42, KVMax: 0.91, Running: 40, InFlight: 57,
		TTFTP50: 180 * time.Millisecond, TTFTP99: 1200 * time.Millisecond,
		ErrorRate: 0.01, HotAdapters: []string{"support-bot"}, Headroom: 0.35, PrefixHitRatio: 0.6,
		Version: 1234567, Produced: time.Date(2026, 11, 29, 23, 0, 0, 123456789, time.UTC),
	}
}

// roundTrip encodes in and decodes the encoding, failing t on an error of
// either.
func roundTrip(t *testing.T, in Digest) (encoded []byte, out Digest) {
	t.Helper()
	b, err := in.AppendBinary(nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := out.UnmarshalBinary(b); err != nil {
		t.Fatal(err)
	}
	return b, out
}

func TestDigestRoundTrip(t *testing.T) {
	in := sampleDigest()
	b, out := roundTrip(t, in)
	// Fractions travel as parts per 65,535.
	for _, f := range []struct {
		name    string
		in, out float64
	}{{"kvMean", in.KVMean, out.KVMean}, {"kvMax", in.KVMax, out.KVMax}, {"errorRate", in.ErrorRate, out.ErrorRate},
		{"headroom", in.Headroom, out.Headroom}, {"prefixHitRatio", in.PrefixHitRatio, out.PrefixHitRatio}} {
		if math.Abs(f.in-f.out) > 1.0/fracScale {
			t.Errorf("%s: %v → %v", f.name, f.in, f.out)
		}
	}
	out.KVMean, out.KVMax, out.ErrorRate, out.Headroom, out.PrefixHitRatio = in.KVMean, in.KVMax, in.ErrorRate, in.Headroom, in.PrefixHitRatio
	if !out.Produced.Equal(in.Produced) {
		t.Errorf("produced %v → %v", in.Produced, out.Produced)
	}
	out.Produced = in.Produced
	if !reflect.DeepEqual(in, out) {
		t.Errorf("round trip:\n got %+v\nwant %+v", out, in)
	}
	t.Logf("encoded digest: %d bytes (with 2 adapters, 1 hot adapter, 32-byte model name)", len(b))
	if len(b) > 200 {
		t.Errorf("digest encodes to %d bytes; a gossip packet holds about 1,350", len(b))
	}
}

func TestDigestValidate(t *testing.T) {
	for name, mutate := range map[string]func(*Digest){
		"no region":        func(d *Digest) { d.Region = "" },
		"no model":         func(d *Digest) { d.Model = "" },
		"long pool":        func(d *Digest) { d.Pool = strings.Repeat("p", 129) },
		"kv above 1":       func(d *Digest) { d.KVMean = 1.5 },
		"NaN error rate":   func(d *Digest) { d.ErrorRate = math.NaN() },
		"negative queue":   func(d *Digest) { d.QueueTotal = -1 },
		"no produced time": func(d *Digest) { d.Produced = time.Time{} },
		"empty adapter":    func(d *Digest) { d.Adapters = []string{""} },
		"too many hot":     func(d *Digest) { d.HotAdapters = make([]string, 17) },
		"negative ttft":    func(d *Digest) { d.TTFTP99 = -time.Second },
	} {
		d := sampleDigest()
		mutate(&d)
		if err := d.Validate(); !errors.Is(err, ErrInvalidDigest) {
			t.Errorf("%s: Validate = %v, want ErrInvalidDigest", name, err)
		}
		if _, err := d.AppendBinary(nil); err == nil {
			t.Errorf("%s: encoded an invalid digest", name)
		}
	}
}

// FuzzDigestDecode: peers may send anything; nothing may panic, and what
// decodes must be valid.
func FuzzDigestDecode(f *testing.F) {
	d := sampleDigest()
	b, _ := d.AppendBinary(nil)
	f.Add(b)
	f.Add(appendList(nil, [][]byte{b, b}))
	f.Add([]byte{kindDigestList, 0xff, 0xff, 0xff, 0xff, 0x0f})
	f.Fuzz(func(t *testing.T, buf []byte) {
		var d Digest
		if err := d.UnmarshalBinary(buf); err == nil {
			if err := d.Validate(); err != nil {
				t.Fatalf("decoded an invalid digest: %v", err)
			}
		}
		parts, _ := splitList(buf)
		for _, p := range parts {
			_ = d.UnmarshalBinary(p)
		}
		s := NewDigestStore(time.Hour, nil)
		s.Merge("peer", buf)
	})
}

func TestStoreVersionOrdering(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := NewDigestStore(5*time.Second, nil)
		now := time.Now()
		d := sampleDigest()
		d.Produced, d.Version = now, 10
		for _, c := range []struct {
			name     string
			produced time.Time
			version  uint64
			queue    int
			stored   bool
		}{
			{"first", now, 10, 1, true},
			{"same version again", now, 10, 2, false},
			{"higher version, same time", now, 11, 3, true},
			{"lower version, same time", now, 9, 4, false},
			{"older produced, higher version", now.Add(-time.Second), 99, 5, false},
			{"newer produced, lower version (another replica)", now.Add(time.Millisecond), 1, 6, true},
		} {
			d.Produced, d.Version, d.QueueTotal = c.produced, c.version, c.queue
			stored, err := s.Put(d)
			if err != nil || stored != c.stored {
				t.Errorf("%s: Put = %v, %v; want %v", c.name, stored, err, c.stored)
			}
		}
		got, ok := s.Get(d.Key())
		if !ok || got.QueueTotal != 6 {
			t.Errorf("held digest has queue %d (ok %v), want 6 (the newest)", got.QueueTotal, ok)
		}
	})
}

func TestStoreExpiry(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := NewDigestStore(5*time.Second, nil)
		d := sampleDigest()
		d.Produced, d.Version = time.Now(), 100
		if ok, _ := s.Put(d); !ok {
			t.Fatal("fresh digest refused")
		}

		time.Sleep(5 * time.Second) // exactly at the bound: still usable
		if _, ok := s.Get(d.Key()); !ok {
			t.Error("digest gone at exactly its age bound")
		}
		time.Sleep(time.Nanosecond)
		if _, ok := s.Get(d.Key()); ok {
			t.Error("stale digest still served")
		}
		if n := len(s.Digests()); n != 0 {
			t.Errorf("Digests lists %d stale digests", n)
		}
		if parts, _ := splitList(s.LocalState()); len(parts) != 0 {
			t.Errorf("LocalState gossips %d stale digests", len(parts))
		}
		if s.Len() != 1 || s.Sweep() != 1 || s.Len() != 0 {
			t.Error("Sweep did not drop the stale digest")
		}

		// A producer that restarted counts versions from scratch; once its
		// old digest is stale the new ones are heard.
		d.Produced, d.Version = time.Now(), 1
		if ok, _ := s.Put(d); !ok {
			t.Error("restarted producer's digest refused")
		}

		// Dated further off than the age bound plus the clock skew allowed:
		// a broken clock or a replay.
		beyond := 5*time.Second + MaxClockSkew + time.Second
		for name, at := range map[string]time.Time{"old": time.Now().Add(-beyond), "future": time.Now().Add(beyond)} {
			d.Produced, d.Version = at, 1000
			if ok, _ := s.Put(d); ok {
				t.Errorf("%s digest accepted", name)
			}
		}
		if st := s.Stats(); st.Implausible != 2 || st.Rejected != 0 {
			t.Errorf("stats %+v: want the 2 misdated digests counted implausible, none invalid", st)
		}
	})
}

// Instances whose clocks disagree by more than the age bound still route on
// each other's digests: freshness is measured from arrival on the
// receiver's clock.
func TestStoreClockSkew(t *testing.T) {
	for _, skew := range []time.Duration{-30 * time.Second, -6 * time.Second, 6 * time.Second, 30 * time.Second} {
		t.Run(skew.String(), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				s := NewDigestStore(5*time.Second, nil)
				d := sampleDigest()
				d.Produced, d.Version = time.Now().Add(skew), 1
				if ok, _ := s.Put(d); !ok {
					t.Fatalf("digest from a producer %s off refused", skew)
				}
				// The producer keeps publishing every second: always fresh.
				for i := range 10 {
					time.Sleep(time.Second)
					d.Produced, d.Version = time.Now().Add(skew), uint64(i+2)
					s.Put(d)
					if _, ok := s.Get(d.Key()); !ok {
						t.Fatalf("after %ds a producer %s off is not routable", i+1, skew)
					}
				}
				// It stops: its last digest goes stale DigestMaxAge after it
				// arrived, whatever its timestamp says.
				time.Sleep(5 * time.Second)
				if _, ok := s.Get(d.Key()); !ok {
					t.Error("digest gone before its age bound")
				}
				time.Sleep(time.Nanosecond)
				if _, ok := s.Get(d.Key()); ok {
					t.Error("stale digest of a skewed producer still served")
				}
			})
		})
	}
}

func TestStoreGossipChannel(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		a := NewDigestStore(5*time.Second, nil)
		b := NewDigestStore(5*time.Second, nil)
		var published []string
		a.SetPublish(func(key string, payload []byte) error {
			published = append(published, key)
			b.Merge("a", payload) // what the gossip layer would deliver
			return nil
		})
		b.SetPublish(func(string, []byte) error { t.Error("merged digests must not be published again"); return nil })

		d := sampleDigest()
		d.Produced = time.Now()
		if _, err := a.Put(d); err != nil {
			t.Fatal(err)
		}
		if _, err := a.Put(d); err != nil { // same version: not published twice
			t.Fatal(err)
		}
		if want := []string{"us-east-1/use1-a/llama-pool"}; !reflect.DeepEqual(published, want) {
			t.Errorf("published %v, want %v", published, want)
		}
		if _, ok := b.Get(d.Key()); !ok {
			t.Error("broadcast digest not merged")
		}

		// Full state converges a third store.
		d2 := d
		d2.Cluster = "use1-b"
		a.Put(d2)
		c := NewDigestStore(5*time.Second, nil)
		c.Merge("a", a.LocalState())
		if got := len(c.Digests()); got != 2 {
			t.Errorf("push/pull carried %d digests, want 2", got)
		}

		// Garbage is counted, not applied.
		c.Merge("evil", []byte{kindDigestList, 1, 3, 1, 2, 3})
		if c.Stats().Rejected == 0 {
			t.Error("malformed payload not counted")
		}
	})
}

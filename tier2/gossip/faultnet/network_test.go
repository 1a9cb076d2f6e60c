package faultnet

import (
	"errors"
	"net"
	"strconv"
	"testing"
	"time"
)

func TestRules(t *testing.T) {
	n := NewNetwork()
	for _, e := range []struct{ addr, name, region string }{
		{"127.0.0.1:1", "use-1", "us-east-1"}, {"127.0.0.1:2", "use-2", "us-east-1"},
		{"127.0.0.1:3", "euw-1", "eu-west-1"}, {"127.0.0.1:4", "aps-1", "ap-south-1"},
	} {
		n.byAddr[e.addr] = endpoint{e.name, e.region}
	}
	use1 := endpoint{"use-1", "us-east-1"}
	n.Delay(Region("us-east-1"), Not(Region("us-east-1")), 40*time.Millisecond)
	n.Delay(Node("aps-1"), Region("us-east-1"), 90*time.Millisecond)
	n.Partition(Node("euw-1"), Node("aps-1"))

	for _, c := range []struct {
		name  string
		src   endpoint
		addr  string
		cut   bool
		delay time.Duration
	}{
		{"same Region", use1, "127.0.0.1:2", false, 0},
		{"to another Region", use1, "127.0.0.1:3", false, 40 * time.Millisecond},
		{"the longest matching delay", use1, "127.0.0.1:4", false, 90 * time.Millisecond},
		{"symmetric", endpoint{"aps-1", "ap-south-1"}, "127.0.0.1:2", false, 90 * time.Millisecond},
		{"partitioned", endpoint{"aps-1", "ap-south-1"}, "127.0.0.1:3", true, 0},
		{"partitioned, other way", endpoint{"euw-1", "eu-west-1"}, "127.0.0.1:4", true, 0},
		{"unknown address passes", use1, "127.0.0.1:9", false, 0},
	} {
		cut, delay := n.verdict(c.src, c.addr)
		if cut != c.cut || delay != c.delay {
			t.Errorf("%s: verdict = cut %v, delay %v; want %v, %v", c.name, cut, delay, c.cut, c.delay)
		}
	}

	n.Heal()
	if cut, delay := n.verdict(endpoint{"aps-1", "ap-south-1"}, "127.0.0.1:3"); cut || delay != 0 {
		t.Errorf("after Heal: cut %v delay %v, want the partition gone", cut, delay)
	}
	if _, delay := n.verdict(use1, "127.0.0.1:3"); delay != 40*time.Millisecond {
		t.Errorf("Heal removed a delay")
	}

	n.Drop(Region("us-east-1"), Region("us-east-1"), 1)
	if cut, _ := n.verdict(use1, "127.0.0.1:2"); !cut {
		t.Error("a drop rate of 1 let a packet through")
	}
}

func TestDialAcrossPartition(t *testing.T) {
	n := NewNetwork()
	a, err := n.Transport("a", "r1")
	if err != nil {
		t.Fatal(err)
	}
	defer a.Shutdown()
	b, err := n.Transport("b", "r2")
	if err != nil {
		t.Fatal(err)
	}
	defer b.Shutdown()
	go func() { // memberlist would take accepted streams; the transport blocks until someone does
		for c := range b.StreamCh() {
			c.Close()
		}
	}()
	ip, port, err := b.FinalAdvertiseAddr("", 0)
	if err != nil {
		t.Fatal(err)
	}
	addr := net.JoinHostPort(ip.String(), strconv.Itoa(port))

	c, err := a.DialTimeout(addr, time.Second)
	if err != nil {
		t.Fatalf("dial before the partition: %v", err)
	}
	n.Partition(Region("r1"), Region("r2"))
	if _, err := c.Write([]byte("x")); !errors.Is(err, ErrPartitioned) {
		t.Errorf("write on an open stream across a new partition = %v, want ErrPartitioned", err)
	}
	c.Close()
	if _, err := a.DialTimeout(addr, time.Second); !errors.Is(err, ErrPartitioned) {
		t.Errorf("dial across the partition = %v, want ErrPartitioned", err)
	}
}

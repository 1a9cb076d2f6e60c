package main

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/meridian-router/meridian/config"
	"github.com/meridian-router/meridian/ratelimit"
	"github.com/meridian-router/meridian/tier2/gossip"
	"github.com/meridian-router/meridian/tier2/gossip/faultnet"
)

// meridianSystem is N Limiters, each on its own memberlist node.
type meridianSystem struct {
	lims   []*ratelimit.Limiter
	nodes  []*gossip.Node
	cancel context.CancelFunc
	wg     sync.WaitGroup
}

func startMeridian(t topology, gossipInterval, syncInterval time.Duration) (*meridianSystem, error) {
	net := faultnet.NewNetwork()
	for _, r := range t.regions {
		net.Delay(faultnet.Region(r), faultnet.Not(faultnet.Region(r)), t.oneWay)
	}
	tenants := map[string]*config.Tenant{"acme": {Spec: config.TenantSpec{Limits: config.TenantLimit{
		Requests: &config.Rate{Limit: t.rate, Per: config.Duration(time.Second)},
	}}}}
	s := &meridianSystem{}
	ctx, cancel := context.WithCancel(context.Background())
	s.cancel = cancel
	for p := range t.peers() {
		name := t.name(p)
		tr, err := net.Transport(name, t.regions[t.region(p)])
		if err != nil {
			s.close()
			return nil, err
		}
		gc := gossip.Config{
			Name: name, Region: t.regions[t.region(p)], Transport: tr,
			Profile:        gossip.ProfileLAN,
			GossipInterval: gossipInterval,
		}
		if p > 0 {
			gc.Join = []string{s.nodes[0].Addr()}
		}
		node, err := gossip.New(gc)
		if err != nil {
			_ = tr.Shutdown()
			s.close()
			return nil, fmt.Errorf("gossip node %s: %w", name, err)
		}
		s.nodes = append(s.nodes, node)
		cfg := ratelimit.DefaultConfig(name)
		cfg.SyncInterval = syncInterval
		cfg.MaxPayload = node.MaxPayload("99")
		lim, err := ratelimit.New(cfg)
		if err != nil {
			s.close()
			return nil, err
		}
		if err := lim.Update(tenants); err != nil {
			s.close()
			return nil, err
		}
		node.Register(gossip.ChannelRateLimit, lim)
		s.lims = append(s.lims, lim)
		s.wg.Add(1)
		go func() {
			defer s.wg.Done()
			_ = lim.Run(ctx, func(key string, payload []byte) {
				_ = node.BroadcastLatest(gossip.ChannelRateLimit, key, payload)
			})
		}()
	}
	return s, nil
}

func (s *meridianSystem) decide(peer int) bool {
	return s.lims[peer].Allow(ratelimit.Request{Tenant: "acme"}).Allowed
}

func (s *meridianSystem) close() {
	s.cancel()
	s.wg.Wait()
	for _, n := range s.nodes {
		_ = n.Close()
	}
}

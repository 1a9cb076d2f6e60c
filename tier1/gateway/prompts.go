package gateway

import "github.com/meridian-router/meridian/tier1"

// PrefillSeconds prices tokens uncached prompt tokens of model (a model or
// adapter this cluster serves) with its pool's latency model; the prior
// for a model not served here. It is the hygiene report's price of lost
// prefill (hygiene.PrefillPrice).
func (g *Gateway) PrefillSeconds(model string, tokens float64) float64 {
	t := g.table.Load()
	r := t.byModel[model]
	if r == nil {
		r = t.byModel[t.adapters[model]]
	}
	if r == nil {
		return tier1.PrefillSeconds(nil, tokens)
	}
	return tier1.PrefillSeconds(r.state.pool.Endpoints(), tokens)
}

package server

import (
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/raftlockd/raftlockd/cluster"
	"github.com/raftlockd/raftlockd/fsm"
)

// utxoCollector reports the UTXO status gauges, reading the state once per
// scrape.
type utxoCollector struct {
	node  *cluster.Node
	descs map[string]*prometheus.Desc
}

var utxoGauges = []struct{ name, help string }{
	{"raftlockd_utxo_chain_height", "Chain height of the UTXO records."},
	{"raftlockd_utxo_transactions", "UTXO transactions stored."},
	{"raftlockd_utxo_records", "UTXO records stored."},
	{"raftlockd_utxo_outputs", "UTXO outputs stored."},
	{"raftlockd_utxo_dah_pending", "UTXO transactions with a delete-at-height."},
	{"raftlockd_utxo_dah_due", "UTXO transactions past their delete-at-height, not yet pruned."},
	{"raftlockd_utxo_pruned_total", "UTXO transactions pruned."},
	{"raftlockd_utxo_prune_passes_total", "Prune passes applied."},
	{"raftlockd_utxo_blocks_applied_total", "Blocks applied."},
	{"raftlockd_utxo_blocks_rolled_back_total", "Blocks rolled back."},
	{"raftlockd_utxo_undo_deltas", "Blocks whose undo delta is kept."},
	{"raftlockd_utxo_retained_unmined_child", "Due transactions kept in the last prune cycle: a child is unmined."},
	{"raftlockd_utxo_retained_unstable_child", "Due transactions kept in the last prune cycle: a child was mined too recently."},
	{"raftlockd_utxo_retained_unreadable_child", "Due transactions kept in the last prune cycle: a child is missing or unreadable."},
}

func newUTXOCollector(n *cluster.Node) *utxoCollector {
	c := &utxoCollector{node: n, descs: map[string]*prometheus.Desc{}}
	for _, g := range utxoGauges {
		c.descs[g.name] = prometheus.NewDesc(g.name, g.help, nil, nil)
	}
	return c
}

func (c *utxoCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range c.descs {
		ch <- d
	}
}

func (c *utxoCollector) Collect(ch chan<- prometheus.Metric) {
	var st fsm.UTXOStatus
	if c.node.FSM().View(func(v *fsm.View) error { st = v.UTXOStatus(); return nil }) != nil {
		return // as stateCollector's: left out, not zeros (the counters would seem reset)
	}
	values := map[string]float64{
		"raftlockd_utxo_chain_height": float64(st.Height), "raftlockd_utxo_transactions": float64(st.Stats.Txs),
		"raftlockd_utxo_records": float64(st.Stats.Records), "raftlockd_utxo_outputs": float64(st.Stats.Outputs),
		"raftlockd_utxo_dah_pending": float64(st.Stats.DAHPending), "raftlockd_utxo_dah_due": float64(st.DueNow),
		"raftlockd_utxo_pruned_total": float64(st.Stats.Pruned), "raftlockd_utxo_prune_passes_total": float64(st.Stats.Passes),
		"raftlockd_utxo_blocks_applied_total":      float64(st.Stats.BlocksApplied),
		"raftlockd_utxo_blocks_rolled_back_total":  float64(st.Stats.BlocksUndone),
		"raftlockd_utxo_undo_deltas":               float64(st.Deltas),
		"raftlockd_utxo_retained_unmined_child":    float64(st.Stats.LastRetained.UnminedChild),
		"raftlockd_utxo_retained_unstable_child":   float64(st.Stats.LastRetained.UnstableChild),
		"raftlockd_utxo_retained_unreadable_child": float64(st.Stats.LastRetained.UnreadableChild),
	}
	for name, d := range c.descs {
		kind := prometheus.GaugeValue
		if strings.HasSuffix(name, "_total") {
			kind = prometheus.CounterValue
		}
		ch <- prometheus.MustNewConstMetric(d, kind, values[name])
	}
}

// chainMetrics times block applies, rollbacks and prune passes on this
// node, with their sizes.
type chainMetrics struct {
	duration *prometheus.HistogramVec
	size     *prometheus.HistogramVec
}

func newChainMetrics(reg prometheus.Registerer) *chainMetrics {
	m := &chainMetrics{
		duration: prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "raftlockd_utxo_op_duration_seconds",
			Help:    "Duration of block applies, rollbacks and prune passes proposed by this node.",
			Buckets: prometheus.ExponentialBuckets(0.0005, 2, 16)}, []string{"op"}),
		size: prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "raftlockd_utxo_op_items",
			Help:    "Transactions per applied block, blocks per rollback, transactions pruned per pass.",
			Buckets: prometheus.ExponentialBuckets(1, 4, 10)}, []string{"op"}),
	}
	reg.MustRegister(m.duration, m.size)
	return m
}

func (m *chainMetrics) observe(op string, d time.Duration, items int) {
	m.duration.WithLabelValues(op).Observe(d.Seconds())
	m.size.WithLabelValues(op).Observe(float64(items))
}

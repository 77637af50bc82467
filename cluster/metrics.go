package cluster

import (
	"time"

	"github.com/hashicorp/raft"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/raftlockd/raftlockd/fsm"
)

type nodeMetrics struct {
	applyBatch     prometheus.Histogram
	entryCommands  prometheus.Histogram
	applySeconds   prometheus.Histogram
	proposeSeconds prometheus.Histogram
	leaderChanges  prometheus.Counter
	storeSeconds   prometheus.Histogram
	forwarded      prometheus.Counter
	grantsPushed   prometheus.Counter
}

func newNodeMetrics(reg prometheus.Registerer, n *Node) *nodeMetrics {
	m := &nodeMetrics{
		applyBatch: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "raftlockd_raft_apply_batch_entries", Help: "Log entries applied per state machine batch.",
			Buckets: []float64{1, 2, 4, 8, 16, 32, 64, 128, 256, 512}}),
		entryCommands: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "raftlockd_raft_entry_commands", Help: "Commands per log entry the leader proposed (commands proposed together are packed into one entry).",
			Buckets: []float64{1, 2, 4, 8, 16, 32, 64, 128, 256, 512}}),
		applySeconds: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "raftlockd_raft_apply_batch_seconds", Help: "Time to apply one batch to the state machine.",
			Buckets: prometheus.ExponentialBuckets(0.00005, 2, 14)}),
		proposeSeconds: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "raftlockd_raft_propose_seconds", Help: "Time from proposing a command to its result on the leader.",
			Buckets: prometheus.ExponentialBuckets(0.0001, 2, 14)}),
		storeSeconds: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "raftlockd_raft_log_store_seconds", Help: "Time to durably append a batch to the Raft log.",
			Buckets: prometheus.ExponentialBuckets(0.00005, 2, 14)}),
		forwarded: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "raftlockd_raft_forwarded_total", Help: "Commands this node forwarded to the leader."}),
		grantsPushed: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "raftlockd_grants_pushed_total", Help: "Grants the leader sent to the servers their acquirers wait on."}),
		leaderChanges: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "raftlockd_raft_leadership_changes_total", Help: "Leadership gained or lost by this node."}),
	}
	if reg == nil {
		return m
	}
	reg.MustRegister(m.applyBatch, m.entryCommands, m.applySeconds, m.proposeSeconds, m.leaderChanges, m.storeSeconds, m.forwarded, m.grantsPushed,
		prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "raftlockd_raft_other_island_refused_total",
			Help: "Raft connections refused because the server dialling belongs to another island."},
			func() float64 {
				if n.mux == nil {
					return 0
				}
				return float64(n.mux.refusals.Load())
			}),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "raftlockd_raft_is_leader", Help: "1 when this node leads."},
			func() float64 {
				if n.IsLeader() {
					return 1
				}
				return 0
			}),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "raftlockd_raft_applied_index", Help: "Last log index applied to the state machine."},
			func() float64 { return float64(n.fsm.Applied()) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "raftlockd_raft_commit_index", Help: "Last committed log index seen by this node."},
			func() float64 { return float64(n.raft.CommitIndex()) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "raftlockd_raft_term", Help: "Current Raft term."},
			func() float64 { return float64(n.raft.CurrentTerm()) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "raftlockd_clock_offset_seconds",
			Help: "How far the members' median clock, which stamps commands, is ahead of this node's clock."},
			func() float64 { return n.clocks.Offset().Seconds() }),
	)
	return m
}

// instrumentedFSM times batches on the way into the state machine, which
// itself never reads a clock.
type instrumentedFSM struct {
	*fsm.FSM
	m       *nodeMetrics
	reached func(logs []*raft.Log) // told of every batch as it begins (packer)
}

func (i *instrumentedFSM) ApplyBatch(logs []*raft.Log) []interface{} {
	i.reached(logs)
	start := time.Now()
	out := i.FSM.ApplyBatch(logs)
	i.m.applySeconds.Observe(time.Since(start).Seconds())
	i.m.applyBatch.Observe(float64(len(logs)))
	return out
}

var _ raft.BatchingFSM = (*instrumentedFSM)(nil)

// timedLogStore times appends to the Raft log, and tells dropsApplied
// when raft cuts off a suffix of the log holding entries already applied.
type timedLogStore struct {
	raft.LogStore
	m            *nodeMetrics
	applied      func() uint64
	dropsApplied func(min, max, term uint64)
}

// DeleteRange implements raft.LogStore. Raft deletes a prefix when it
// compacts the log and a suffix when a leader's entries conflict with it;
// a conflicting suffix that reaches down to an applied entry means the
// cluster committed other entries in its place.
func (t *timedLogStore) DeleteRange(min, max uint64) error {
	last, err := t.LogStore.LastIndex()
	if err != nil {
		return err
	}
	// The term of the first entry dropped, for the report.
	var first raft.Log
	if max >= last && min <= t.applied() {
		_ = t.LogStore.GetLog(min, &first)
	}
	err = t.LogStore.DeleteRange(min, max)
	if err == nil && max >= last && min <= t.applied() {
		t.dropsApplied(min, max, first.Term)
	}
	return err
}

func (t *timedLogStore) StoreLogs(logs []*raft.Log) error {
	start := time.Now()
	err := t.LogStore.StoreLogs(logs)
	t.m.storeSeconds.Observe(time.Since(start).Seconds())
	return err
}

func (t *timedLogStore) StoreLog(l *raft.Log) error { return t.StoreLogs([]*raft.Log{l}) }

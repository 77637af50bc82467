package lincheck

import (
	"fmt"
	"math/rand"
	"time"
)

// Cluster is what the nemesis can do to a cluster. Nodes are numbered
// 0..Size()-1.
type Cluster interface {
	Size() int
	Name(i int) string
	Leader() int // a node that leads, -1 when none is known
	Stop(i int)  // shut the node down (its data dir is kept)
	Start(i int) // start a stopped node again
	Partition(groups ...[]int)
	Slow(i int, d time.Duration) // delay every link of node i
	Heal()                       // restore every link, remove every delay
}

// Nemesis breaks a cluster on a random schedule drawn from Rand: it
// isolates the leader, partitions a random minority off, stops (and later
// restarts) the leader or another node, crash-restarts a node, slows a
// node's links, and now and then splits every node from every other for a
// moment. At most one such fault is active at a time, apart from the brief
// full splits, so that a majority is available most of the time; a fault
// lasts until a later step heals it.
type Nemesis struct {
	Cluster  Cluster
	Rand     *rand.Rand
	Recorder *Recorder
	// Step bounds the pause between two steps (default 150-600ms).
	MinStep, MaxStep time.Duration

	stopped  map[int]bool
	faulty   bool // a partition or delay is in place
	noQuorum bool
}

// Run applies faults for d, then heals everything and restarts stopped
// nodes.
func (n *Nemesis) Run(d time.Duration) {
	if n.MinStep == 0 {
		n.MinStep, n.MaxStep = 150*time.Millisecond, 600*time.Millisecond
	}
	end := time.Now().Add(d)
	for {
		pause := n.MinStep + time.Duration(n.Rand.Int63n(int64(n.MaxStep-n.MinStep)+1))
		if time.Now().Add(pause).After(end) {
			time.Sleep(time.Until(end))
			break
		}
		time.Sleep(pause)
		n.step()
	}
	n.Recover()
}

func (n *Nemesis) broken() bool { return n.faulty || len(n.stopped) > 0 }

// Recover heals every link and starts every stopped node.
func (n *Nemesis) Recover() {
	if n.faulty {
		n.Cluster.Heal()
		n.Recorder.Note("heal")
		n.faulty, n.noQuorum = false, false
	}
	for i := 0; i < n.Cluster.Size(); i++ {
		if n.stopped[i] {
			n.Cluster.Start(i)
			n.Recorder.Note("start %s", n.Cluster.Name(i))
			delete(n.stopped, i)
		}
	}
}

func (n *Nemesis) step() {
	if n.broken() {
		if n.noQuorum || n.Rand.Float64() < 0.6 {
			n.Recover()
		}
		return
	}
	if n.Rand.Float64() < 0.15 {
		return // a quiet spell
	}
	size := n.Cluster.Size()
	target, what := n.Cluster.Leader(), "leader "
	if target < 0 || n.Rand.Float64() < 0.4 {
		target, what = n.Rand.Intn(size), ""
	}
	name := what + n.Cluster.Name(target)
	switch p := n.Rand.Float64(); {
	case p < 0.30:
		n.Cluster.Partition([]int{target}, n.others(target))
		n.faulty = true
		n.Recorder.Note("isolate %s", name)
	case p < 0.42:
		minority := n.minority()
		n.Cluster.Partition(minority, n.rest(minority))
		n.faulty = true
		n.Recorder.Note("partition off %s", n.names(minority))
	case p < 0.64:
		n.Recorder.Note("stop %s", name)
		n.Cluster.Stop(target)
		if n.stopped == nil {
			n.stopped = map[int]bool{}
		}
		n.stopped[target] = true
	case p < 0.76:
		n.Recorder.Note("crash-restart %s", name)
		n.Cluster.Stop(target)
		n.Cluster.Start(target)
	case p < 0.90:
		d := time.Duration(30+n.Rand.Intn(170)) * time.Millisecond
		n.Cluster.Slow(target, d)
		n.faulty = true
		n.Recorder.Note("slow %s by %s", name, d)
	default:
		var groups [][]int
		for i := 0; i < size; i++ {
			groups = append(groups, []int{i})
		}
		n.Cluster.Partition(groups...)
		n.faulty, n.noQuorum = true, true
		n.Recorder.Note("split every node (no quorum)")
	}
}

func (n *Nemesis) others(i int) []int {
	var out []int
	for j := 0; j < n.Cluster.Size(); j++ {
		if j != i {
			out = append(out, j)
		}
	}
	return out
}

// minority picks 1..(size-1)/2 random nodes.
func (n *Nemesis) minority() []int {
	size := n.Cluster.Size()
	m := 1 + n.Rand.Intn(max(1, (size-1)/2))
	return n.Rand.Perm(size)[:m]
}

func (n *Nemesis) rest(group []int) []int {
	in := map[int]bool{}
	for _, i := range group {
		in[i] = true
	}
	var out []int
	for j := 0; j < n.Cluster.Size(); j++ {
		if !in[j] {
			out = append(out, j)
		}
	}
	return out
}

func (n *Nemesis) names(group []int) string {
	var out []string
	for _, i := range group {
		out = append(out, n.Cluster.Name(i))
	}
	return fmt.Sprint(out)
}

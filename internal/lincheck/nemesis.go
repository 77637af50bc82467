package lincheck

import (
	"math/rand"
	"strings"
	"time"
)

// Cluster is what the nemesis can do to a cluster. Nodes are numbered
// 0..Size()-1.
type Cluster interface {
	Size() int
	Name(i int) string
	Leader() int // a node that leads, -1 when none is known
	Stop(i int)  // shut the node down gracefully (its data dir is kept)
	// Crash kills the node at once: its peers and clients lose every
	// connection to it without an answer or a goodbye, and it is torn down
	// without closing its state file cleanly. With reboot its host goes
	// down too, so its state file is rebuilt from the Raft snapshot and
	// log on restart.
	Crash(i int, reboot bool)
	Start(i int) // start a stopped or crashed node again
	// Freeze pauses the node as its peers and clients see a paused
	// process: no bytes in or out on any of its connections, requests to
	// it hang, until Thaw delivers whatever was held.
	Freeze(i int)
	Thaw(i int)
	Partition(groups ...[]int)
	Slow(i int, d time.Duration) // delay every link of node i
	Heal()                       // restore every link, remove every delay
}

// Nemesis breaks a cluster on a random schedule drawn from Rand. Each fault
// hits one node, or in clusters of five or more up to a minority of nodes
// at once (the leader often among them): it partitions them off, freezes
// them (a paused process), crashes them (now and then with their host, or
// restarting them at once), stops them gracefully, or slows their links;
// now and then it splits every node from every other for a moment. At most
// one such fault is active at a time, so that a majority is available most
// of the time; a fault lasts until a later step heals it.
type Nemesis struct {
	Cluster  Cluster
	Rand     *rand.Rand
	Recorder *Recorder
	// Step bounds the pause between two steps (default 150-600ms).
	MinStep, MaxStep time.Duration

	down     map[int]bool // stopped or crashed
	frozen   map[int]bool
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

func (n *Nemesis) broken() bool { return n.faulty || len(n.down) > 0 || len(n.frozen) > 0 }

// Recover thaws every node, heals every link and starts every stopped or
// crashed node.
func (n *Nemesis) Recover() {
	for i := 0; i < n.Cluster.Size(); i++ {
		if n.frozen[i] {
			n.Cluster.Thaw(i)
			n.Recorder.Note("thaw %s", n.Cluster.Name(i))
			delete(n.frozen, i)
		}
	}
	if n.faulty {
		n.Cluster.Heal()
		n.Recorder.Note("heal")
		n.faulty, n.noQuorum = false, false
	}
	for i := 0; i < n.Cluster.Size(); i++ {
		if n.down[i] {
			n.Cluster.Start(i)
			n.Recorder.Note("start %s", n.Cluster.Name(i))
			delete(n.down, i)
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
	if n.Rand.Float64() < 0.12 {
		return // a quiet spell
	}
	targets, names := n.targets()
	switch p := n.Rand.Float64(); {
	case p < 0.22:
		n.Cluster.Partition(targets, n.rest(targets))
		n.faulty = true
		n.Recorder.Note("partition off %s", strings.Join(names, ", "))
	case p < 0.74:
		for k, i := range targets {
			n.nodeFault(i, names[k])
		}
	case p < 0.88:
		d := time.Duration(20+n.Rand.Intn(100)) * time.Millisecond
		for _, i := range targets {
			n.Cluster.Slow(i, d)
		}
		n.faulty = true
		n.Recorder.Note("slow %s by %s each way", strings.Join(names, ", "), d)
	default:
		var groups [][]int
		for i := 0; i < n.Cluster.Size(); i++ {
			groups = append(groups, []int{i})
		}
		n.Cluster.Partition(groups...)
		n.faulty, n.noQuorum = true, true
		n.Recorder.Note("split every node (no quorum)")
	}
}

// targets picks the nodes of the next fault: one, or in clusters of five
// or more up to a minority; the leader is the first of them more often
// than not.
func (n *Nemesis) targets() ([]int, []string) {
	size := n.Cluster.Size()
	k := 1
	if f := (size - 1) / 2; f > 1 && n.Rand.Float64() < 0.5 {
		k = 2 + n.Rand.Intn(f-1)
	}
	var out []int
	in := map[int]bool{}
	leader := n.Cluster.Leader()
	if leader >= 0 && n.Rand.Float64() < 0.6 {
		out, in[leader] = append(out, leader), true
	}
	for _, i := range n.Rand.Perm(size) {
		if len(out) == k {
			break
		}
		if !in[i] {
			out, in[i] = append(out, i), true
		}
	}
	names := make([]string, len(out))
	for k, i := range out {
		names[k] = n.Cluster.Name(i)
		if i == leader {
			names[k] = "leader " + names[k]
		}
	}
	return out, names
}

// nodeFault freezes, crashes or stops node i until a later step recovers
// it; a crashed node is sometimes restarted at once.
func (n *Nemesis) nodeFault(i int, name string) {
	if n.down == nil {
		n.down, n.frozen = map[int]bool{}, map[int]bool{}
	}
	switch p := n.Rand.Float64(); {
	case p < 0.40:
		n.Recorder.Note("freeze %s", name)
		n.Cluster.Freeze(i)
		n.frozen[i] = true
	case p < 0.85:
		reboot := n.Rand.Float64() < 0.25
		what := "crash"
		if reboot {
			what = "power off"
		}
		if n.Rand.Float64() < 0.3 {
			n.Recorder.Note("%s and restart %s", what, name)
			n.Cluster.Crash(i, reboot)
			n.Cluster.Start(i)
			return
		}
		n.Recorder.Note("%s %s", what, name)
		n.Cluster.Crash(i, reboot)
		n.down[i] = true
	default:
		n.Recorder.Note("stop %s", name)
		n.Cluster.Stop(i)
		n.down[i] = true
	}
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

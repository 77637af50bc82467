package testcluster

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand"
	"slices"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/rs/xid"

	"github.com/raftlockd/raftlockd/client"
	"github.com/raftlockd/raftlockd/config"
	"github.com/raftlockd/raftlockd/errcode"
	"github.com/raftlockd/raftlockd/fsm"
	"github.com/raftlockd/raftlockd/internal/faultnet"
	"github.com/raftlockd/raftlockd/internal/testutil"
	"github.com/raftlockd/raftlockd/wire"
)

// envXAFaultSeed reruns TestXAUnderFaults with the schedule of one seed.
const envXAFaultSeed = "RAFTLOCKD_XA_FAULT_SEED"

const (
	xfQueue    = "xafault"
	xfKeys     = 6 // keys per island, shared by every client
	xfLeaseTTL = 4 // seconds, the mean of the leases' TTLs
	xfPending  = 4 * time.Second
)

// xfTxn is one transaction a client ran and what it was answered.
type xfTxn struct {
	id, client string
	home       int       // the island whose coordinator decides it
	keys       [2]string // the key acquired on each island ("" when none was)
	staged     [2]bool   // its update there was answered
	msgID      string    // its staged enqueue on the island that is not home, when answered
	msgMaybe   bool      // an enqueue whose answer was lost
	failed     string    // the acquire, update or enqueue that failed, and how
	asked      []string  // the decisions requested, in order (commit, rollback, pending, release-commit ...)
	answer     string    // commit, rollback, or "" (none, or none known)
	answers    []string  // every answer, for the report
}

type xfHistory struct {
	mu   sync.Mutex
	txns []*xfTxn
}

// note records what f sets on a transaction, which the settling check
// reads meanwhile.
func (h *xfHistory) note(f func()) {
	h.mu.Lock()
	defer h.mu.Unlock()
	f()
}

// TestXAUnderFaults runs transactions across two islands of three nodes
// each while a nemesis crashes and freezes nodes of either island (leaders
// more often than their share) and partitions the islands from each
// other. Each transaction acquires a key on both islands, appends its id
// to both documents, now and then stages an enqueue on the island that
// does not coordinate it, and is committed or rolled back through its home
// island's coordinator (by a decision, or by a release after a prepare),
// or abandoned before or after its prepare. After the faults heal and the
// islands settle (no lease, staged write, pending decision, unapplied
// decision or RM in doubt left), it checks that each transaction's writes
// are on every island or on none, that they agree with the decision the
// home island recorded and with the record of the other island, that
// every answered commit or rollback holds, and that no transaction is
// left pending.
//
// The schedule is random; RAFTLOCKD_XA_FAULT_SEED=<seed> reruns one.
func TestXAUnderFaults(t *testing.T) {
	seed, chaos, rng := faultSchedule(t, envXAFaultSeed, 12*time.Second)
	t.Logf("seed %d: two islands of 3 nodes, faults for %s (rerun: %s=%d)", seed, chaos, envXAFaultSeed, seed)

	fabric := faultnet.New()
	xa := Configure(func(cfg *config.Server) {
		cfg.TCFanoutTimeout = time.Second
		cfg.TCFanoutAttempts = 3
		cfg.TCFanoutBaseDelay = 20 * time.Millisecond
		cfg.TCFanoutMaxDelay = 200 * time.Millisecond
		cfg.TCPendingTTL = xfPending
	})
	isl := [2]*Cluster{Start(t, 3, OnFabric(fabric, "a"), xa), Start(t, 3, OnFabric(fabric, "b"), xa)}
	var hashes [2]string
	var clients [2]*client.Client
	for i, c := range isl {
		hashes[i] = c.Nodes[0].Server.Node().BackendHash()
		var urls []string
		for j := range c.Nodes {
			urls = append(urls, c.URL(j))
		}
		cl, err := client.New(strings.Join(urls, ","), client.WithRetry(2*time.Second),
			client.WithHTTPClient(c.OperatorHTTPClient("client")))
		if err != nil {
			t.Fatal(err)
		}
		clients[i] = cl
	}
	xfRegister(t, isl, hashes, clients)

	h := &xfHistory{}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	until := time.Now().Add(chaos)
	var workers sync.WaitGroup
	for w := 0; w < 6; w++ {
		wrng := rand.New(rand.NewSource(rng.Int63()))
		workers.Add(1)
		go func() {
			defer workers.Done()
			for time.Now().Before(until) && ctx.Err() == nil {
				x := &xfTxn{id: xid.New().String(), client: fmt.Sprintf("c%d", w), home: wrng.Intn(2)}
				h.note(func() { h.txns = append(h.txns, x) })
				xfRun(ctx, clients, hashes, wrng, h, x)
				pause(ctx, time.Duration(20+wrng.Intn(200))*time.Millisecond)
			}
		}()
	}
	events := xfNemesis(isl, rng, chaos)
	t.Logf("nemesis: %s", strings.Join(events, ", "))
	workers.Wait()
	healed := time.Now()

	// Every decision reaches every island, every abandoned transaction
	// expires and every lease ends: pending transactions expire within
	// xfPending, leases within their TTL; the resolvers' backoff after a
	// long partition is what takes longest.
	var left string
	settled := func() bool {
		var parts []string
		for i, c := range isl {
			l := c.Leader()
			if l < 0 {
				parts = append(parts, fmt.Sprintf("island %d: no leader", i))
				continue
			}
			_ = c.Nodes[l].Server.Node().FSM().View(func(v *fsm.View) error {
				leases, _ := v.Counts()
				var unacked, doubts, pending int
				v.FanoutEach(func(string) bool { unacked++; return true })
				v.DoubtEach(1<<62, func(string) bool { doubts++; return true })
				h.mu.Lock()
				for _, x := range h.txns {
					if r := v.Txn(x.id); r != nil && r.State == fsm.TxnPending {
						pending++
					}
				}
				h.mu.Unlock()
				st := v.QueueStats(wire.DefaultNamespace, xfQueue)
				if leases+v.StagedWrites()+unacked+doubts+pending+int(st.Staged) > 0 {
					parts = append(parts, fmt.Sprintf("island %d: %d leases, %d staged writes, %d staged messages, "+
						"%d decisions not applied everywhere, %d transactions in doubt, %d pending", i, leases,
						v.StagedWrites(), st.Staged, unacked, doubts, pending))
				}
				return nil
			})
		}
		left = strings.Join(parts, "; ")
		return len(parts) == 0
	}
	for deadline := time.Now().Add(45 * time.Second); !settled(); time.Sleep(100 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("seed %d (rerun: %s=%d): the islands did not settle within 45s of healing: %s", seed,
				envXAFaultSeed, seed, left)
		}
	}
	t.Logf("settled %s after the faults healed", time.Since(healed).Round(time.Millisecond))

	// What every island holds now: the transactions in each key's
	// document, the messages its queue delivers, each transaction's record.
	var in [2]map[string]int // transaction -> documents of the island naming it
	var problems []string
	for i := range isl {
		in[i] = map[string]int{}
		for k := 0; k < xfKeys; k++ {
			key := fmt.Sprintf("xf-%d-%d", i, k)
			d, err := clients[i].GetPublic(ctx, "", key)
			if err != nil {
				t.Fatalf("seed %d: read %s on island %d: %v", seed, key, i, err)
			}
			for _, id := range xfChain(d) {
				in[i][id]++
			}
		}
	}
	queued := map[string][]int{} // transaction -> islands whose queue delivered its message
	for i := range isl {
		for {
			octx, ocancel := context.WithTimeout(ctx, 10*time.Second)
			d, err := clients[i].Dequeue(octx, wire.DequeueRequest{Queue: xfQueue, Owner: "drain", WaitSeconds: wire.BlockNoWait})
			ocancel()
			if err != nil || d == nil {
				if err != nil && !errors.Is(err, errcode.Waiting) {
					t.Fatalf("seed %d: drain island %d: %v", seed, i, err)
				}
				break
			}
			queued[string(d.Payload)] = append(queued[string(d.Payload)], i)
			if err := d.Ack(ctx); err != nil {
				t.Fatalf("seed %d: ack %s on island %d: %v", seed, d.Message.MessageID, i, err)
			}
		}
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	records := map[string][2]*wire.TxnStatusResponse{}
	for _, x := range h.txns {
		var rs [2]*wire.TxnStatusResponse
		for i := range isl {
			st, err := clients[i].TxnStatus(ctx, x.id)
			switch {
			case err == nil:
				rs[i] = st
			case !errors.Is(err, errcode.NotFound):
				t.Fatalf("seed %d: status of %s on island %d: %v", seed, x.id, i, err)
			}
		}
		records[x.id] = rs
	}
	problems = append(problems, xfCheck(h.txns, hashes, in, queued, records)...)
	t.Logf("seed %d: %s; %d messages delivered", seed, xfSummary(h.txns, records), len(queued))
	if len(problems) > 0 {
		if len(problems) > 30 {
			problems = append(problems[:30], fmt.Sprintf("... and %d more", len(problems)-30))
		}
		t.Fatalf("seed %d (rerun: %s=%d):\n  %s", seed, envXAFaultSeed, seed, strings.Join(problems, "\n  "))
	}
	for _, c := range isl {
		c.WaitConverged(20 * time.Second)
	}
}

// xfRegister makes each island know the other's endpoints.
func xfRegister(t *testing.T, isl [2]*Cluster, hashes [2]string, clients [2]*client.Client) {
	t.Helper()
	ctx := context.Background()
	for i := range isl {
		o := isl[1-i]
		for j := range o.Nodes {
			if _, err := clients[i].RMRegister(ctx, wire.TCRMRegisterRequest{BackendHash: hashes[1-i], Endpoint: o.URL(j)},
				false); err != nil {
				t.Fatalf("register %s at island %d: %v", o.URL(j), i, err)
			}
		}
	}
	testutil.WaitFor(t, 10*time.Second, "each island to know the other's endpoints", func() bool {
		for i := range isl {
			l := isl[i].Leader()
			if l < 0 {
				return false
			}
			var n int
			_ = isl[i].Nodes[l].Server.Node().FSM().View(func(v *fsm.View) error {
				n = len(v.RMs()[hashes[1-i]].Endpoints)
				return nil
			})
			if n != len(isl[1-i].Nodes) {
				return false
			}
		}
		return true
	})
}

// xfDoc is a key's document: the transactions that committed a write to
// it, in order.
type xfDoc struct {
	Txns []string `json:"txns"`
}

func xfChain(d *client.Document) []string {
	var doc xfDoc
	if d != nil && d.Exists {
		_ = json.Unmarshal(d.Body, &doc)
	}
	return doc.Txns
}

// xfOutcome reads a decision's answer: commit, rollback, or "" when the
// outcome is not known (a lost answer, a fan-out that did not finish, a
// refusal that decided nothing).
func xfOutcome(state string, err error) string {
	switch {
	case err == nil && (state == wire.TxnStateCommit || state == wire.TxnStateRollback):
		return state
	case errors.Is(err, errcode.TxnCommitted):
		return wire.TxnStateCommit
	case errors.Is(err, errcode.TxnRolledBack), errors.Is(err, errcode.TxnLockConflict):
		return wire.TxnStateRollback
	}
	return ""
}

// xfRun runs transaction x: a key on each island with its id appended,
// now and then a staged enqueue on the island that is not home, and then a
// commit, a rollback or nothing.
func xfRun(ctx context.Context, clients [2]*client.Client, hashes [2]string, rng *rand.Rand, h *xfHistory, x *xfTxn) {
	op := func() (context.Context, context.CancelFunc) {
		return context.WithTimeout(ctx, time.Duration(800+rng.Intn(3000))*time.Millisecond)
	}
	var leases [2]*client.Lease
	ok := true
	for _, i := range rng.Perm(2) {
		key := fmt.Sprintf("xf-%d-%d", i, rng.Intn(xfKeys))
		octx, cancel := op()
		l, err := clients[i].Acquire(octx, wire.AcquireRequest{Key: key, Owner: x.id, TTLSeconds: xfLeaseTTL - 2 + int64(rng.Intn(5)),
			BlockSecs: 2,
			TxnID:     x.id})
		if err == nil {
			var d *client.Document
			if d, err = l.Get(octx); err == nil {
				body, _ := json.Marshal(xfDoc{Txns: append(xfChain(d), x.id)})
				_, err = l.Update(octx, body, client.Conditions{})
			}
			h.note(func() { x.keys[i], x.staged[i] = key, err == nil })
			leases[i] = l
		}
		cancel()
		if err != nil {
			h.note(func() { x.failed = fmt.Sprintf("%s on island %d: %v", key, i, err) })
			ok = false
			break
		}
	}
	rm := 1 - x.home
	if ok && rng.Intn(2) == 0 {
		octx, cancel := op()
		out, err := clients[rm].Enqueue(octx, wire.EnqueueRequest{Queue: xfQueue, TxnID: x.id}, []byte(x.id))
		cancel()
		h.note(func() {
			if err == nil {
				x.msgID = out.MessageID
			} else {
				x.msgMaybe, x.failed = true, fmt.Sprintf("enqueue on island %d: %v", rm, err)
			}
		})
		ok = err == nil
	}
	var parts []wire.TxnParticipant
	for i, key := range x.keys {
		if key != "" {
			parts = append(parts, wire.TxnParticipant{Namespace: wire.DefaultNamespace, Key: key, BackendHash: hashes[i]})
		}
	}
	if x.msgID != "" {
		parts = append(parts, wire.TxnParticipant{Namespace: wire.DefaultNamespace,
			Key: "q/" + xfQueue + "/msg/" + x.msgID, BackendHash: hashes[rm]})
	}
	decide := func(state string, expires int64) (string, error) {
		h.note(func() { x.asked = append(x.asked, state) })
		octx, cancel := op()
		defer cancel()
		out, err := clients[x.home].TxnDecide(octx, wire.TxnDecisionRequest{TxnID: x.id, State: state, Participants: parts,
			ExpiresAtUnix: expires, Owner: x.id})
		var got string
		if err == nil {
			got = out.State
		}
		h.note(func() {
			x.answers = append(x.answers, fmt.Sprintf("%s: %s %v", state, got, err))
			if o := xfOutcome(got, err); o != "" {
				x.answer = o
			}
		})
		return got, err
	}
	// decideAgain asks for state, once more after an answer that says
	// nothing, as a client does.
	decideAgain := func(state string) {
		if _, err := decide(state, 0); err != nil && xfOutcome("", err) == "" && rng.Intn(2) == 0 {
			pause(ctx, time.Duration(rng.Intn(1000))*time.Millisecond)
			_, _ = decide(state, 0)
		}
	}
	if !ok {
		// Given up on: rolled back, or left to expire.
		if rng.Intn(4) != 0 && len(parts) > 0 {
			decideAgain(wire.TxnStateRollback)
		}
		return
	}
	// Now and then the client works on the transaction for about as
	// long as its leases last, so that some decisions come too late.
	if rng.Intn(4) == 0 {
		pause(ctx, time.Duration(rng.Intn(xfLeaseTTL*1500))*time.Millisecond)
	}
	prepare := func() bool {
		st, err := decide(wire.TxnStatePending, time.Now().Add(xfPending).Unix())
		return err == nil && st == wire.TxnStatePending
	}
	switch r := rng.Intn(100); {
	case r < 30:
		decideAgain(wire.TxnStateCommit)
	case r < 45:
		if prepare() {
			decideAgain(wire.TxnStateCommit)
		}
	case r < 60:
		// A release of either lease, once prepared, goes to the home
		// coordinator, which decides the whole transaction.
		if !prepare() {
			return
		}
		i := rng.Intn(2)
		rollback := rng.Intn(3) == 0
		state := map[bool]string{false: "release-commit", true: "release-rollback"}[rollback]
		h.note(func() { x.asked = append(x.asked, state) })
		octx, cancel := op()
		err := leases[i].Release(octx, rollback)
		cancel()
		h.note(func() {
			x.answers = append(x.answers, fmt.Sprintf("%s of island %d's lease: %v", state, i, err))
			switch {
			case err == nil && rollback:
				x.answer = wire.TxnStateRollback
			case err == nil:
				x.answer = wire.TxnStateCommit
			default:
				if o := xfOutcome("", err); o != "" {
					x.answer = o
				}
			}
		})
	case r < 80:
		decideAgain(wire.TxnStateRollback)
	case r < 90:
		// Abandoned: its leases expire.
	default:
		// Abandoned once prepared: its pending decision expires.
		prepare()
	}
}

// xfNemesis breaks things for d: at most one node of each island at a
// time (crashed, crashed and restarted at once, powered off, or frozen;
// its leader more often than its share) and the link between the islands
// (partitioned), healing one fault at a time. Then it heals everything.
// It returns what it did.
func xfNemesis(isl [2]*Cluster, rng *rand.Rand, d time.Duration) []string {
	var events []string
	fabric := isl[0].Fabric
	names := func(c *Cluster) []string {
		var out []string
		for _, n := range c.Nodes {
			out = append(out, n.Name)
		}
		return out
	}
	broken := [2]map[int]string{{}, {}} // node -> down or frozen
	parted := false
	heal := func(i, n int) {
		c := isl[i]
		switch broken[i][n] {
		case "down":
			c.Start(n)
			events = append(events, "start "+c.Nodes[n].Name)
		case "frozen":
			c.Thaw(n)
			events = append(events, "thaw "+c.Nodes[n].Name)
		}
		delete(broken[i], n)
	}
	end := time.Now().Add(d)
	for time.Now().Before(end) {
		time.Sleep(time.Duration(300+rng.Intn(900)) * time.Millisecond)
		faults := len(broken[0]) + len(broken[1])
		if parted {
			faults++
		}
		if faults > 0 && rng.Intn(2) == 0 {
			var which []string
			if parted {
				which = append(which, "link")
			}
			for i := range isl {
				for n := range broken[i] {
					which = append(which, fmt.Sprintf("%d/%d", i, n))
				}
			}
			sort.Strings(which)
			w := which[rng.Intn(len(which))]
			if w == "link" {
				fabric.Heal()
				parted = false
				events = append(events, "join islands")
				continue
			}
			var i, n int
			_, _ = fmt.Sscanf(w, "%d/%d", &i, &n)
			heal(i, n)
			continue
		}
		if rng.Intn(4) == 0 {
			if !parted {
				fabric.Partition(names(isl[0]), names(isl[1]))
				parted = true
				events = append(events, "partition islands")
			}
			continue
		}
		i := rng.Intn(2)
		c := isl[i]
		if len(broken[i]) > 0 {
			continue
		}
		victim := rng.Intn(len(c.Nodes))
		if l := c.Leader(); l >= 0 && rng.Intn(3) != 0 {
			victim = l
		}
		name := c.Nodes[victim].Name
		switch r := rng.Intn(10); {
		case r < 3:
			c.Crash(victim)
			broken[i][victim] = "down"
			events = append(events, "crash "+name)
		case r < 5:
			c.Crash(victim)
			c.Start(victim)
			events = append(events, "crash+restart "+name)
		case r < 6:
			c.PowerOff(victim)
			broken[i][victim] = "down"
			events = append(events, "poweroff "+name)
		default:
			c.Freeze(victim)
			broken[i][victim] = "frozen"
			events = append(events, "freeze "+name)
		}
	}
	fabric.Heal()
	for i, c := range isl {
		for n := range c.Nodes {
			heal(i, n)
		}
	}
	for _, c := range isl {
		c.WaitLeader(30 * time.Second)
	}
	return events
}

// xfCheck compares what the islands hold with the transactions' history:
// in[i] counts the documents of island i naming each transaction, queued
// the islands whose queue delivered its message, records its record on
// each island (nil: none).
func xfCheck(txns []*xfTxn, hashes [2]string, in [2]map[string]int, queued map[string][]int,
	records map[string][2]*wire.TxnStatusResponse) []string {
	var problems []string
	known := map[string]bool{}
	for _, x := range txns {
		known[x.id] = true
		bad := func(format string, args ...any) {
			problems = append(problems, fmt.Sprintf("%s (%s, home %d, keys %q, staged %v, message %q maybe %v, failed %q, "+
				"asked %v, answers %q): ", x.id, x.client, x.home, x.keys, x.staged, x.msgID, x.msgMaybe, x.failed, x.asked,
				x.answers)+
				fmt.Sprintf(format, args...))
		}
		rm := 1 - x.home
		// Its effects: a write on each island, a message on the island
		// that is not home; sure when staging it was answered.
		type effect struct {
			what          string
			sure, present bool
		}
		var effects []effect
		for i := range x.keys {
			if in[i][x.id] > 1 {
				bad("appended %d times on island %d", in[i][x.id], i)
			}
			if in[i][x.id] > 0 && x.keys[i] == "" {
				bad("in a document of island %d where it acquired no key", i)
			}
			effects = append(effects, effect{fmt.Sprintf("its write on island %d", i), x.staged[i], in[i][x.id] > 0})
		}
		if q := queued[x.id]; len(q) > 1 || len(q) == 1 && q[0] != rm {
			bad("its message was delivered on islands %v, enqueued on island %d", q, rm)
		}
		if len(queued[x.id]) > 0 && x.msgID == "" && !x.msgMaybe {
			bad("a message that was never enqueued was delivered")
		}
		effects = append(effects, effect{fmt.Sprintf("its message on island %d", rm), x.msgID != "", len(queued[x.id]) > 0})
		committed := false
		var seen []string
		for _, e := range effects {
			committed = committed || e.present
			seen = append(seen, fmt.Sprintf("%s %v", e.what, e.present))
		}

		// (1) Atomicity: every write or message known to be staged is
		// there if and only if any is.
		for _, e := range effects {
			if e.sure && e.present != committed {
				bad("not atomic: %s", strings.Join(seen, ", "))
				break
			}
		}

		// (2) Agreement: the home island's decision is what was applied,
		// and the other island's record says the same.
		rs := records[x.id]
		state := func(i int) string {
			if rs[i] == nil {
				return ""
			}
			return rs[i].State
		}
		home, other := state(x.home), state(rm)
		switch {
		case committed && home != wire.TxnStateCommit:
			bad("applied, but the home island's record is %q", home)
		case !committed && home == wire.TxnStateCommit:
			bad("the home island recorded commit, but nothing was applied")
		}
		if other != "" && other != wire.TxnStatePending && home != "" && other != home {
			bad("the home island recorded %s, the other island %s", home, other)
		}
		if other == wire.TxnStateCommit && home != wire.TxnStateCommit {
			bad("the other island recorded commit, the home island %q", home)
		}
		if home == wire.TxnStateCommit {
			if rs[x.home].TCBackendHash != "" && rs[x.home].TCBackendHash != hashes[x.home] {
				bad("the home island's record names island %s as coordinator", rs[x.home].TCBackendHash)
			}
			for _, p := range rs[x.home].Participants {
				if p.BackendHash == hashes[rm] && !slices.Contains(rs[x.home].Acked, hashes[rm]) {
					bad("committed, but the home island does not record that the other island applied it")
					break
				}
			}
		}

		// (3) Answers hold: a commit answered is applied everywhere, a
		// rollback answered nowhere, and nothing commits unasked.
		switch x.answer {
		case wire.TxnStateCommit:
			if !committed || home != wire.TxnStateCommit {
				bad("answered commit, but recorded %q at home; %s", home, strings.Join(seen, ", "))
			}
		case wire.TxnStateRollback:
			if committed || home == wire.TxnStateCommit {
				bad("answered rollback, but recorded %q at home; %s", home, strings.Join(seen, ", "))
			}
		}
		if committed && !slices.Contains(x.asked, wire.TxnStateCommit) && !slices.Contains(x.asked, "release-commit") {
			bad("committed, but nobody asked for a commit")
		}

		// (4) Finality: nothing is left pending.
		if home == wire.TxnStatePending || other == wire.TxnStatePending {
			bad("still pending after healing: at home %q, on the other island %q", home, other)
		}
	}
	for i := range in {
		for id := range in[i] {
			if !known[id] {
				problems = append(problems, fmt.Sprintf("island %d's documents name %s, which no client ran", i, id))
			}
		}
	}
	for id := range queued {
		if !known[id] {
			problems = append(problems, fmt.Sprintf("a message of %s, which no client ran, was delivered", id))
		}
	}
	return problems
}

// xfSummary counts what happened, for the log.
func xfSummary(txns []*xfTxn, records map[string][2]*wire.TxnStatusResponse) string {
	count := map[string]int{}
	for _, x := range txns {
		home := "none"
		if r := records[x.id][x.home]; r != nil {
			home = r.State
		}
		answer := x.answer
		if answer == "" {
			answer = "unknown"
		}
		count[fmt.Sprintf("answered %s, recorded %s", answer, home)]++
	}
	var parts []string
	for k, v := range count {
		parts = append(parts, fmt.Sprintf("%s: %d", k, v))
	}
	sort.Strings(parts)
	return fmt.Sprintf("%d transactions: %s", len(txns), strings.Join(parts, ", "))
}

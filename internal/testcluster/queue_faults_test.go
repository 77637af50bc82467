package testcluster

import (
	"context"
	"errors"
	"fmt"
	"math/rand"
	"os"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/raftlockd/raftlockd/client"
	"github.com/raftlockd/raftlockd/errcode"
	"github.com/raftlockd/raftlockd/wire"
)

// envQFaultSeed reruns TestQueueUnderFaults with the schedule of one seed.
const envQFaultSeed = "RAFTLOCKD_QFAULT_SEED"

const (
	qfQueue       = "qfault"
	qfDLQ         = qfQueue + ".dlq"
	qfMaxAttempts = 3
	qfVisibility  = 2 // seconds, the lease of every delivery
)

// qfEnqueue is one message a producer sent: confirmed when an answer
// named its message id; unconfirmed ones may or may not exist.
type qfEnqueue struct {
	payload string
	key     string   // the idempotency key; "" for a single attempt
	ids     []string // the message ids answered, one per answered attempt
}

// qfDelivery is one delivery a consumer received and what it did with it.
type qfDelivery struct {
	consumer       string
	queue          string
	msgID, payload string
	leaseID        string
	token          int64
	attempts       int
	failures       int
	maxAttempts    int
	sent, recv     time.Time // the dequeue request's start and its answer
	expiry         time.Time // lower bound of when its lease ends, by the server's expiry
	extendSent     time.Time // when an extend that was answered was sent
	extendTo       time.Time // the expiry it answered
	action         string    // ack, nack-failure, nack-defer, lapse
	endSent        time.Time // when the ack or nack was sent
	endRecv        time.Time // when it was answered
	result         string    // ok, failed (no effect), maybe
	deadLetter     string    // a nack's dead_letter_queue
	requeued       bool
}

type qfHistory struct {
	mu         sync.Mutex
	enqueues   map[string]*qfEnqueue // by payload
	deliveries []*qfDelivery
	problems   []string // found as they happened
}

// TestQueueUnderFaults runs producers and consumers on every node of a
// cluster while a nemesis crashes, powers off, freezes and partitions off
// nodes (never more than a minority at once), then heals the cluster,
// drains the queue and its dead-letter queue, and checks what the queue
// API promises: no acknowledged enqueue is lost (each is acked or dead-
// lettered), no message is acked by two deliveries or held by two
// unexpired leases at once, an enqueue retried with its idempotency key is
// one message, the attempt and failure counts follow what the consumers
// did (a deferring nack spends no attempt), and afterwards every node
// holds the same, empty queues and the same state.
//
// The schedule is random; RAFTLOCKD_QFAULT_SEED=<seed> reruns one.
func TestQueueUnderFaults(t *testing.T) {
	seed, chaos, rng := faultSchedule(t, envQFaultSeed, 15*time.Second)

	// Three nodes, or (for one seed in three, outside -short) five, of
	// which two may be broken at once.
	size := 3
	if !testing.Short() && rng.Intn(3) == 0 {
		size = 5
	}
	t.Logf("seed %d: %d nodes, faults for %s (rerun: %s=%d)", seed, size, chaos, envQFaultSeed, seed)
	c := Start(t, size)
	clients := make([]*client.Client, size)
	for i := range c.Nodes {
		clients[i] = c.sdk(i, 2*time.Second, c.HTTPClient("client"))
	}
	h := &qfHistory{enqueues: map[string]*qfEnqueue{}}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()

	// Producers: one per node, each with its own random source drawn from
	// the seed (the interleaving is not reproducible, the choices are),
	// for as long as the nemesis runs.
	produceUntil := time.Now().Add(chaos)
	var producers sync.WaitGroup
	for p := 0; p < size; p++ {
		prng := rand.New(rand.NewSource(rng.Int63()))
		producers.Add(1)
		go func() {
			defer producers.Done()
			for n := 0; time.Now().Before(produceUntil); n++ {
				e := &qfEnqueue{payload: fmt.Sprintf("p%d-%03d", p, n)}
				if prng.Intn(2) == 0 {
					e.key = "k-" + e.payload
				}
				h.mu.Lock()
				h.enqueues[e.payload] = e
				h.mu.Unlock()
				// A deadline shorter than most faults leaves some answers
				// unknown.
				qfSend(ctx, clients[(p+n)%size], h, e, time.Duration(500+prng.Intn(5500))*time.Millisecond)
				if e.key != "" && len(qfIDs(h, e)) == 0 && prng.Intn(2) == 0 {
					// Resent at once through another node.
					qfSend(ctx, clients[(p+n+1)%size], h, e, time.Duration(500+prng.Intn(5500))*time.Millisecond)
				}
				pause(ctx, time.Duration(30+prng.Intn(120))*time.Millisecond)
			}
		}()
	}

	// Consumers: two per node, one dequeuing and one subscribing. While
	// draining they dequeue, ack every delivery and take from the
	// dead-letter queue too.
	var draining, stop = make(chan struct{}), make(chan struct{})
	var consumers sync.WaitGroup
	for w := 0; w < 2*size; w++ {
		crng := rand.New(rand.NewSource(rng.Int63()))
		consumers.Add(1)
		go func() {
			defer consumers.Done()
			qfConsume(stop, draining, clients[w%size], fmt.Sprintf("c%d", w), w%2 == 1, crng, h)
		}()
	}

	// The nemesis: faults on a minority of the nodes at a time.
	events := qfNemesis(c, rng, chaos)
	t.Logf("nemesis: %s", strings.Join(events, ", "))
	producers.Wait()
	healed := time.Now()
	close(draining)

	// Keyed enqueues whose answer was lost are resent until answered, and
	// some answered ones once more (most of them are acked by now): each
	// must be answered with the message id it had, and enqueue nothing.
	h.mu.Lock()
	var resend, answered []*qfEnqueue
	for _, e := range h.enqueues {
		switch {
		case e.key != "" && len(e.ids) == 0:
			resend = append(resend, e)
		case e.key != "":
			answered = append(answered, e)
		}
	}
	h.mu.Unlock()
	sort.Slice(answered, func(i, j int) bool { return answered[i].payload < answered[j].payload })
	rng.Shuffle(len(answered), func(i, j int) { answered[i], answered[j] = answered[j], answered[i] })
	for _, e := range answered[:min(len(answered), 20)] {
		before := len(qfIDs(h, e))
		rctx, rcancel := context.WithTimeout(ctx, 30*time.Second)
		for len(qfIDs(h, e)) == before && rctx.Err() == nil {
			qfSend(rctx, clients[rng.Intn(size)], h, e, 6*time.Second)
		}
		rcancel()
	}
	rctx, rcancel := context.WithTimeout(ctx, 30*time.Second)
	for i, e := range resend {
		for len(qfIDs(h, e)) == 0 && rctx.Err() == nil {
			qfSend(rctx, clients[i%size], h, e, 6*time.Second)
		}
		if len(qfIDs(h, e)) == 0 {
			t.Fatalf("the resent enqueue %s (key %s) was not answered", e.payload, e.key)
		}
	}
	rcancel()

	// Drain: wait until the leader's queue and dead-letter queue are empty.
	empty := func(st *wire.QueueStatsResponse) bool {
		return st.HeadMessageID == "" && st.Ready+st.InFlight+st.Delayed+st.Staged+st.DeadLetterReady == 0
	}
	drainDeadline := time.Now().Add(45 * time.Second)
	for {
		l := c.Leader()
		if l >= 0 {
			a, err1 := clients[l].QueueStats(ctx, "", qfQueue, false)
			b, err2 := clients[l].QueueStats(ctx, "", qfDLQ, false)
			if err1 == nil && err2 == nil && empty(a) && empty(b) {
				break
			}
		}
		if time.Now().After(drainDeadline) {
			close(stop)
			consumers.Wait()
			t.Fatalf("seed %d: the queues were not drained within 45s", seed)
		}
		time.Sleep(100 * time.Millisecond)
	}
	close(stop)
	consumers.Wait()
	t.Logf("drained %s after the cluster healed", time.Since(healed).Round(time.Millisecond))

	// Every node agrees that both queues are empty, and on its state.
	for _, q := range []string{qfQueue, qfDLQ} {
		var last string
		ok := func() bool {
			var views []string
			for i := range c.Nodes {
				st, err := c.Client(i).QueueStats(ctx, "", q, true)
				if err != nil {
					last = err.Error()
					return false
				}
				views = append(views, fmt.Sprintf("%s: ready %d in_flight %d delayed %d staged %d dlq %d head %q",
					c.Nodes[i].Name, st.Ready, st.InFlight, st.Delayed, st.Staged, st.DeadLetterReady, st.HeadMessageID))
				if !empty(st) {
					last = strings.Join(views, "; ")
					return false
				}
			}
			return true
		}
		deadline := time.Now().Add(15 * time.Second)
		for !ok() {
			if time.Now().After(deadline) {
				t.Fatalf("seed %d: stats of %s on every node: %s", seed, q, last)
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	c.WaitConverged(20 * time.Second)

	h.mu.Lock()
	defer h.mu.Unlock()
	problems := qfCheck(h)
	t.Logf("seed %d: %s", seed, qfSummary(h))
	if len(problems) > 0 {
		if len(problems) > 30 {
			problems = append(problems[:30], fmt.Sprintf("... and %d more", len(problems)-30))
		}
		t.Fatalf("seed %d (rerun: %s=%d):\n  %s", seed, envQFaultSeed, seed, strings.Join(problems, "\n  "))
	}
}

// faultSeed returns the seed named by the environment variable env, or a
// new one.
func faultSeed(t *testing.T, env string) int64 {
	t.Helper()
	v := os.Getenv(env)
	if v == "" {
		return time.Now().UnixNano()
	}
	seed, err := strconv.ParseInt(v, 10, 64)
	if err != nil {
		t.Fatalf("%s: %v", env, err)
	}
	return seed
}

// faultSchedule starts a randomized fault test's schedule: its seed (from
// env when set), how long faults are injected (chaos, or 6 s with -short)
// and the random source its choices come from.
func faultSchedule(t *testing.T, env string, chaos time.Duration) (int64, time.Duration, *rand.Rand) {
	t.Helper()
	seed := faultSeed(t, env)
	if testing.Short() {
		chaos = 6 * time.Second
	}
	return seed, chaos, rand.New(rand.NewSource(seed))
}

// pause waits d or until ctx ends: pacing, not waiting for a condition.
func pause(ctx context.Context, d time.Duration) {
	select {
	case <-ctx.Done():
	case <-time.After(d):
	}
}

// qfIDs returns the message ids answered to e's attempts so far.
func qfIDs(h *qfHistory, e *qfEnqueue) []string {
	h.mu.Lock()
	defer h.mu.Unlock()
	return append([]string(nil), e.ids...)
}

// qfSend makes one enqueue attempt of e (the client resends a keyed one
// after an ambiguous failure within its retry window) and records the
// message id answered.
func qfSend(ctx context.Context, cl *client.Client, h *qfHistory, e *qfEnqueue, timeout time.Duration) {
	octx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	r, err := cl.EnqueueWithKey(octx, wire.EnqueueRequest{Queue: qfQueue, VisibilityTimeoutSeconds: qfVisibility,
		MaxAttempts: qfMaxAttempts}, []byte(e.payload), e.key)
	if err != nil {
		return
	}
	h.mu.Lock()
	e.ids = append(e.ids, r.MessageID)
	h.mu.Unlock()
}

// qfDefinite reports whether err says that an ack, nack or extend did
// nothing: the delivery was not the message's lease, or the message is
// gone.
func qfDefinite(err error) bool {
	return errors.Is(err, errcode.QueueLeaseMismatch) || errors.Is(err, errcode.QueueMessageNotFound)
}

// qfConsume dequeues until stop, or until draining subscribes in streams
// that end after a few seconds, and hands each delivery to qfHandle. While
// draining it dequeues from the queue and the dead-letter queue in turn.
func qfConsume(stop, draining <-chan struct{}, cl *client.Client, name string, subscribe bool, rng *rand.Rand,
	h *qfHistory) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() {
		<-stop
		cancel()
	}()
	for turn := 0; ctx.Err() == nil; turn++ {
		drain := false
		select {
		case <-draining:
			drain = true
		default:
		}
		if subscribe && !drain {
			// A stream whose context ends hands back the deliveries it
			// read and did not pass on.
			sctx, scancel := context.WithTimeout(ctx, time.Duration(1000+rng.Intn(4000))*time.Millisecond)
			sent := time.Now()
			_ = cl.Subscribe(sctx, wire.DequeueRequest{Queue: qfQueue, Owner: name, WaitSeconds: 1,
				PageSize: 1 + rng.Intn(2)}, func(d *client.Delivery) error {
				qfHandle(ctx, d, qfQueue, name, sent, time.Now(), false, rng, h)
				return nil
			})
			scancel()
			pause(ctx, 20*time.Millisecond)
			continue
		}
		q := qfQueue
		if drain && turn%2 == 1 {
			q = qfDLQ
		}
		// Now and then a consumer gives up on its dequeue while it waits
		// or while its delivery is on the way: it leaves the line, or the
		// delivery is handed back or its lease runs out unseen.
		timeout := 6 * time.Second
		if !drain && rng.Intn(4) == 0 {
			timeout = time.Duration(300+rng.Intn(2200)) * time.Millisecond
		}
		octx, ocancel := context.WithTimeout(ctx, timeout)
		sent := time.Now()
		wait := int64(1)
		if q == qfDLQ {
			wait = wire.BlockNoWait // dead letters are all there by now
		}
		d, err := cl.Dequeue(octx, wire.DequeueRequest{Queue: q, Owner: name, WaitSeconds: wait})
		recv := time.Now()
		ocancel()
		if err != nil || d == nil {
			if (q == qfDLQ || !errors.Is(err, errcode.Waiting)) && ctx.Err() == nil {
				pause(ctx, 50*time.Millisecond) // a node down or between leaders, or no dead letter
			}
			continue
		}
		qfHandle(ctx, d, q, name, sent, recv, drain, rng, h)
	}
}

// qfHandle records delivery d and gives it its fate: until draining,
// mostly acked, sometimes nacked (failing or deferring), left to lapse, or
// extended before the ack, now and then after working on it for about as
// long as its lease; while draining it is acked.
func qfHandle(ctx context.Context, d *client.Delivery, q, name string, sent, recv time.Time, drain bool, rng *rand.Rand,
	h *qfHistory) {
	m := d.Message
	rec := &qfDelivery{consumer: name, queue: q, msgID: m.MessageID, payload: string(d.Payload), leaseID: m.LeaseID,
		token: m.FencingToken, attempts: m.Attempts, failures: m.FailureAttempts, maxAttempts: m.MaxAttempts,
		sent: sent, recv: recv, expiry: time.Unix(m.LeaseExpiresAtUnix, 0)}
	h.mu.Lock()
	h.deliveries = append(h.deliveries, rec)
	h.mu.Unlock()
	action := "ack"
	if !drain {
		switch r := rng.Intn(100); {
		case r < 15:
			action = "nack-failure"
		case r < 25:
			action = "nack-defer"
		case r < 31:
			action = "lapse"
		case r < 41:
			action = "extend"
		}
		// Work on the message for a while, now and then for about
		// as long as its lease, so that faults hit held leases and
		// some acks come too late.
		if rng.Intn(4) == 0 {
			pause(ctx, time.Duration(rng.Intn(2200))*time.Millisecond)
		}
	}
	// While faults go on, a deadline shorter than most faults leaves
	// some outcomes unknown.
	timeout := 6 * time.Second
	if !drain && rng.Intn(3) == 0 {
		timeout = time.Duration(300+rng.Intn(1500)) * time.Millisecond
	}
	octx, ocancel := context.WithTimeout(ctx, timeout)
	if action == "extend" {
		extendSent := time.Now()
		out, err := d.Extend(octx, qfVisibility*time.Second)
		if err == nil {
			// An extend whose outcome is not known leaves the lower
			// bound of the lease's end where it was.
			h.mu.Lock()
			rec.expiry = time.Unix(out.LeaseExpiresAtUnix, 0)
			rec.extendSent, rec.extendTo = extendSent, rec.expiry
			h.mu.Unlock()
		}
		action = "ack"
	}
	var res string
	var delay time.Duration
	if action == "nack-defer" {
		delay = time.Duration(rng.Intn(2)) * time.Second
	}
	// end sends the consumer's ack or nack (nothing for a lease left to
	// lapse).
	end := func(ctx context.Context) (*wire.NackResponse, error) {
		switch action {
		case "ack":
			return nil, d.Ack(ctx)
		case "nack-failure":
			return d.Nack(ctx, wire.NackIntentFailure, 0, []byte(`"qfault"`))
		case "nack-defer":
			return d.Nack(ctx, wire.NackIntentDefer, delay, nil)
		}
		return nil, nil
	}
	endSent := time.Now()
	nr, err := end(octx)
	ocancel()
	if err == nil && action != "lapse" && rng.Intn(4) == 0 {
		// The same ack or nack once more, as after a lost answer, now or
		// after the message was delivered again: it is answered as the
		// first was and changes nothing.
		if rng.Intn(2) == 0 {
			pause(ctx, time.Duration(rng.Intn(1500))*time.Millisecond)
		}
		rctx, rcancel := context.WithTimeout(ctx, 6*time.Second)
		m := d.Message
		again, rerr := end(rctx)
		rcancel()
		var problem string
		switch {
		case rerr != nil && qfDefinite(rerr):
			problem = fmt.Sprintf("%s/%s: the %s of token %d sent again answered %v", q, m.MessageID, action,
				m.FencingToken, rerr)
		case again != nil && rerr == nil && (again.Requeued != nr.Requeued || again.DeadLetterQueue != nr.DeadLetterQueue):
			problem = fmt.Sprintf("%s/%s: the %s of token %d sent again answered requeued %v, dead_letter_queue %q, "+
				"the first requeued %v, dead_letter_queue %q", q, m.MessageID, action, m.FencingToken, again.Requeued,
				again.DeadLetterQueue, nr.Requeued, nr.DeadLetterQueue)
		}
		if problem != "" {
			h.mu.Lock()
			h.problems = append(h.problems, problem)
			h.mu.Unlock()
		}
	}
	switch {
	case err == nil:
		res = "ok"
	case qfDefinite(err):
		res = "failed"
	default:
		res = "maybe"
	}
	h.mu.Lock()
	rec.action, rec.result, rec.endSent, rec.endRecv = action, res, endSent, time.Now()
	if nr != nil && err == nil {
		rec.deadLetter, rec.requeued = nr.DeadLetterQueue, nr.Requeued
	}
	h.mu.Unlock()
}

// qfNemesis breaks nodes for d, at most a minority at a time: it crashes
// a node (restarting it later, or at once), powers it off, freezes it or
// partitions it off, the leader more often than its share, and heals one
// fault at a time. Then it heals everything and restarts every node. It
// returns what it did.
func qfNemesis(c *Cluster, rng *rand.Rand, d time.Duration) []string {
	var events []string
	size := len(c.Nodes)
	state := map[int]string{} // broken node -> down, frozen or parted
	parted := func() {
		groups := [][]int{}
		var rest []int
		for i := range c.Nodes {
			if state[i] == "parted" {
				groups = append(groups, []int{i})
			} else {
				rest = append(rest, i)
			}
		}
		if len(groups) == 0 {
			c.Heal()
			return
		}
		c.Partition(append(groups, rest)...)
	}
	heal := func(i int) {
		name := c.Nodes[i].Name
		switch state[i] {
		case "down":
			c.Start(i)
			events = append(events, "start "+name)
		case "frozen":
			c.Thaw(i)
			events = append(events, "thaw "+name)
		case "parted":
			delete(state, i)
			parted()
			events = append(events, "rejoin "+name)
		}
		delete(state, i)
	}
	end := time.Now().Add(d)
	for time.Now().Before(end) {
		time.Sleep(time.Duration(200+rng.Intn(700)) * time.Millisecond)
		if len(state) > 0 && (len(state) >= (size-1)/2 || rng.Intn(2) == 0) {
			var broken []int
			for i := range state {
				broken = append(broken, i)
			}
			sort.Ints(broken)
			heal(broken[rng.Intn(len(broken))])
			continue
		}
		victim := rng.Intn(size)
		if l := c.Leader(); l >= 0 && rng.Intn(2) == 0 {
			victim = l
		}
		if state[victim] != "" {
			continue
		}
		name := c.Nodes[victim].Name
		switch r := rng.Intn(10); {
		case r < 2:
			c.Crash(victim)
			state[victim] = "down"
			events = append(events, "crash "+name)
		case r < 3:
			c.Crash(victim)
			c.Start(victim)
			events = append(events, "crash+restart "+name)
		case r < 5:
			c.PowerOff(victim)
			state[victim] = "down"
			events = append(events, "poweroff "+name)
		case r < 7:
			c.Freeze(victim)
			state[victim] = "frozen"
			events = append(events, "freeze "+name)
		default:
			state[victim] = "parted"
			parted()
			events = append(events, "partition "+name)
		}
	}
	for i := range c.Nodes {
		heal(i)
	}
	c.WaitLeader(30 * time.Second)
	return events
}

// qfCheck compares the history with what the queue API promises.
func qfCheck(h *qfHistory) []string {
	problems := append([]string(nil), h.problems...)
	bad := func(format string, args ...any) { problems = append(problems, fmt.Sprintf(format, args...)) }

	// Idempotency: every answer to a payload's enqueue names one message,
	// and every delivery of a payload is of that message.
	idOf := map[string]string{}      // payload -> message id
	payloadOf := map[string]string{} // message id -> payload
	for _, e := range h.enqueues {
		for _, id := range e.ids {
			if idOf[e.payload] != "" && idOf[e.payload] != id {
				bad("%s (key %q) was enqueued as %s and as %s", e.payload, e.key, idOf[e.payload], id)
			}
			idOf[e.payload] = id
			payloadOf[id] = e.payload
		}
	}
	byMsg := map[string][]*qfDelivery{} // queue/message id -> deliveries
	for _, d := range h.deliveries {
		if _, ok := h.enqueues[d.payload]; !ok {
			bad("%s delivered %s with a payload %q nobody enqueued", d.consumer, d.msgID, d.payload)
			continue
		}
		if id := idOf[d.payload]; id != "" && id != d.msgID {
			bad("%s was enqueued as %s but delivered as %s", d.payload, id, d.msgID)
		}
		if p := payloadOf[d.msgID]; p != "" && p != d.payload {
			bad("message %s carries %s and %s", d.msgID, p, d.payload)
		}
		idOf[d.payload], payloadOf[d.msgID] = d.msgID, d.payload
		byMsg[d.queue+"/"+d.msgID] = append(byMsg[d.queue+"/"+d.msgID], d)
	}

	// Per message: deliveries in fencing order, one ack at most, leases
	// that do not overlap, and counts that follow what the consumers did.
	// Message ids acked, or delivered from the dead-letter queue: a nack
	// answering that it moved the message there is not enough, the drain
	// must find it there.
	done := map[string]bool{}
	for _, ds := range byMsg {
		sort.Slice(ds, func(i, j int) bool { return ds[i].token < ds[j].token })
		for i, d := range ds {
			if d.result == "ok" && d.action == "ack" || d.result == "maybe" && d.action == "ack" || d.queue == qfDLQ {
				done[d.msgID] = true
			}
			if i == 0 {
				continue
			}
			p := ds[i-1]
			if p.token == d.token {
				bad("%s/%s: two deliveries with fencing token %d (leases %s, %s)", d.queue, d.msgID, d.token, p.leaseID, d.leaseID)
				continue
			}
			if d.attempts <= p.attempts {
				bad("%s/%s: attempts %d after %d", d.queue, d.msgID, d.attempts, p.attempts)
			}
			// Every earlier lease ended before this delivery was made.
			for _, q := range ds[:i] {
				end := q.expiry
				switch {
				case q.action == "ack" && q.result == "ok":
					bad("%s/%s: delivered to %s (token %d) after %s acked token %d", d.queue, d.msgID, d.consumer,
						d.token, q.consumer, q.token)
				case strings.HasPrefix(q.action, "nack") && q.result == "ok":
					// Accepted: the lease had not run out when it was sent.
					end = q.endSent
				case strings.HasPrefix(q.action, "nack") && q.result == "maybe" && q.endSent.Before(end):
					end = q.endSent
				}
				if d.recv.Before(end) {
					bad("%s/%s: delivered to %s (token %d) by %s while %s held token %d until at least %s "+
						"(delivered by %s, expiry %s, then %s %s sent at %s)",
						d.queue, d.msgID, d.consumer, d.token, d.recv.Format("15:04:05.000"), q.consumer, q.token,
						end.Format("15:04:05.000"), q.recv.Format("15:04:05.000"), q.expiry.Format("15:04:05"), q.action,
						q.result, q.endSent.Format("15:04:05.000"))
				}
			}
			if d.queue != qfQueue {
				continue
			}
			if d.failures < p.failures {
				bad("%s/%s: failure_attempts %d after %d", d.queue, d.msgID, d.failures, p.failures)
			}
			if d.attempts != p.attempts+1 {
				continue // a delivery in between that no consumer saw
			}
			var want []int // the possible failure counts now
			switch {
			case p.action == "nack-defer" && p.result == "ok":
				want = []int{p.failures}
			case p.action == "nack-defer" && p.result == "maybe":
				want = []int{p.failures, p.failures + 1}
			default:
				// A failing nack, or a lease that ran out: the ack or nack
				// did not take effect, or this delivery would not be.
				want = []int{p.failures + 1}
			}
			if !containsInt(want, d.failures) {
				bad("%s/%s: failure_attempts %d after %s %s of a delivery with %d (want %v)", d.queue, d.msgID,
					d.failures, p.action, p.result, p.failures, want)
			}
		}
		for _, d := range ds {
			if d.maxAttempts != qfMaxAttempts {
				bad("%s/%s: delivered with max_attempts %d, enqueued with %d", d.queue, d.msgID, d.maxAttempts,
					qfMaxAttempts)
			}
			if d.queue == qfDLQ && d.failures < qfMaxAttempts {
				bad("%s/%s: a dead letter with %d failures of %d", d.queue, d.msgID, d.failures, qfMaxAttempts)
			}
			// An extend by the visibility runs from when it is applied.
			if !d.extendSent.IsZero() && d.extendTo.Unix() < d.extendSent.Add(qfVisibility*time.Second).Unix() {
				bad("%s/%s: an extend by %ds sent at %s answered an expiry of %s", d.queue, d.msgID, qfVisibility,
					d.extendSent.Format("15:04:05.000"), d.extendTo.Format("15:04:05"))
			}
			if d.queue != qfQueue {
				continue
			}
			if d.failures >= qfMaxAttempts {
				bad("%s/%s: delivered with %d failures of at most %d", d.queue, d.msgID, d.failures, qfMaxAttempts)
			}
			if d.action == "nack-failure" && d.result == "ok" && (d.deadLetter != "") != (d.failures+1 >= d.maxAttempts) {
				bad("%s/%s: a failing nack after %d of %d failures answered dead_letter_queue %q", d.queue, d.msgID,
					d.failures, d.maxAttempts, d.deadLetter)
			}
			if d.action == "nack-defer" && d.result == "ok" && (d.deadLetter != "" || !d.requeued) {
				bad("%s/%s: a deferring nack answered requeued %v, dead_letter_queue %q", d.queue, d.msgID, d.requeued,
					d.deadLetter)
			}
		}
	}

	// No message is acked by two deliveries, counting its dead letter.
	acks := map[string][]string{}
	for _, d := range h.deliveries {
		if d.action == "ack" && d.result == "ok" {
			acks[d.msgID] = append(acks[d.msgID], fmt.Sprintf("%s token %d in %s", d.consumer, d.token, d.queue))
		}
	}
	for id, a := range acks {
		if len(a) > 1 {
			bad("message %s acked by %d deliveries: %v", id, len(a), a)
		}
	}

	// Nothing answered is lost.
	for _, e := range h.enqueues {
		if len(e.ids) > 0 && !done[e.ids[0]] {
			var ds []string
			for _, d := range byMsg[qfQueue+"/"+e.ids[0]] {
				ds = append(ds, fmt.Sprintf("%s token %d %s %s", d.consumer, d.token, d.action, d.result))
			}
			bad("%s (message %s, key %q) was neither acked nor delivered from %s; deliveries: %v", e.payload, e.ids[0],
				e.key, qfDLQ, ds)
		}
	}
	return problems
}

func containsInt(s []int, v int) bool {
	for _, x := range s {
		if x == v {
			return true
		}
	}
	return false
}

// qfSummary counts what happened, for the log.
func qfSummary(h *qfHistory) string {
	var confirmed, keyed int
	for _, e := range h.enqueues {
		if len(e.ids) > 0 {
			confirmed++
		}
		if e.key != "" {
			keyed++
		}
	}
	count := map[string]int{}
	dlq := 0
	for _, d := range h.deliveries {
		count[d.action+" "+d.result]++
		if d.queue == qfDLQ {
			dlq++
		}
	}
	var parts []string
	for k, v := range count {
		parts = append(parts, fmt.Sprintf("%s %d", k, v))
	}
	sort.Strings(parts)
	return fmt.Sprintf("%d enqueues (%d answered, %d keyed), %d deliveries (%d dead letters): %s", len(h.enqueues),
		confirmed, keyed, len(h.deliveries), dlq, strings.Join(parts, ", "))
}

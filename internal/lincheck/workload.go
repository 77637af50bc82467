package lincheck

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"math/rand"
	"net"
	"net/http"
	"sync"
	"time"

	"github.com/raftlockd/raftlockd/client"
	"github.com/raftlockd/raftlockd/wire"
)

// Workload runs concurrent clients, each talking to one node, that acquire,
// keep alive, write (now and then conditionally), remove, read and release
// a few keys at random and record every operation.
type Workload struct {
	Endpoints []string // API base URL of each node
	Names     []string // node names, for the history's metadata (optional)
	Clients   int
	// Readers are clients that only read committed documents (public
	// gets of random keys), one after another, reader i through node i
	// modulo the nodes: with every node serving a steady stream of reads,
	// a stale read (a node answering from its own, lagging state) or a
	// lost commit shows in the history. Their ids follow the clients'.
	Readers  int
	Keys     []string
	TTL      time.Duration // lease TTL, whole seconds
	Block    time.Duration // how long an acquire waits for a held key, whole seconds
	Seed     int64
	Recorder *Recorder
	// Think is the longest pause between two operations of a client.
	Think time.Duration
	// Expire is the chance that a lease holder sleeps past its TTL before
	// its next operation, which must then fail.
	Expire float64
	// Keep is the chance that an acquire asks for a one-second lease whose
	// holder keeps it alive and then sleeps past the expiry its keepalive
	// replaced: its next operations must still succeed.
	Keep float64
	// Timeout bounds one HTTP exchange (an acquire gets Block on top).
	Timeout time.Duration
	// Dial connects the clients to the nodes (default: TCP with a one
	// second timeout); a fault-injecting network goes here.
	Dial func(ctx context.Context, network, addr string) (net.Conn, error)
	// TLS is what the clients present to the nodes and check them against
	// (see auth.ClientConfig); nil for nodes that serve plain HTTP.
	TLS *tls.Config
}

// Start launches the clients. They stop starting operations once stop is
// closed; wait returns when all are done (an operation in flight, retries
// included, finishes first).
func (w *Workload) Start(stop <-chan struct{}) (wait func()) {
	if w.Timeout == 0 {
		w.Timeout = 3 * time.Second
	}
	if w.Think == 0 {
		w.Think = 15 * time.Millisecond
	}
	dial := w.Dial
	if dial == nil {
		dial = (&net.Dialer{Timeout: time.Second}).DialContext
	}
	tr := &http.Transport{MaxIdleConnsPerHost: 8, IdleConnTimeout: 5 * time.Second, DialContext: dial, TLSClientConfig: w.TLS}
	hc := &http.Client{Transport: tr}
	seeds := rand.New(rand.NewSource(w.Seed))
	var wg sync.WaitGroup
	for i := 0; i < w.Clients+w.Readers; i++ {
		r := rand.New(rand.NewSource(seeds.Int63()))
		node := r.Intn(len(w.Endpoints))
		reader := i >= w.Clients
		if reader {
			node = (i - w.Clients) % len(w.Endpoints)
		}
		c, err := client.New(w.Endpoints[node], client.WithRetry(0), client.WithHTTPClient(hc))
		if err != nil {
			panic(err) // endpoints are URLs the cluster gave us
		}
		k := &worker{w: w, id: i, r: r, c: c, stop: stop, node: fmt.Sprint(node)}
		if node < len(w.Names) {
			k.node = w.Names[node]
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			if reader {
				k.read()
			} else {
				k.run()
			}
		}()
	}
	return func() {
		wg.Wait()
		tr.CloseIdleConnections()
	}
}

type worker struct {
	w    *Workload
	id   int
	r    *rand.Rand
	c    *client.Client
	stop <-chan struct{}
	node string
	seq  int

	lease          *client.Lease
	name           string
	minExp, maxExp int64
	// ttl is the lease's TTL, the longest it may be after an ambiguous
	// keepalive that named a longer one (ttlSure is false then, and
	// keepalives name their TTL, so that it never shrinks).
	ttl     time.Duration
	ttlSure bool
	// ver and etag are the holder's view as this client last saw it, what
	// its conditions ask for.
	ver  int64
	etag string
}

func (k *worker) stopped() bool {
	select {
	case <-k.stop:
		return true
	default:
		return false
	}
}

// sleep pauses for d or until the workload stops.
func (k *worker) sleep(d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
	case <-k.stop:
	}
}

func (k *worker) key() string { return k.w.Keys[k.r.Intn(len(k.w.Keys))] }

func (k *worker) run() {
	// A client still holding a lease when the workload stops stages one
	// more write and goes away, as one that crashes mid-transaction: its
	// lease runs out, which must roll the write back (Finish).
	defer func() {
		if k.lease != nil {
			k.update()
		}
	}()
	for !k.stopped() {
		k.sleep(time.Duration(1 + k.r.Int63n(int64(k.w.Think))))
		if k.stopped() {
			return
		}
		if k.lease == nil {
			if k.r.Float64() < 0.25 {
				k.publicGet(k.key())
			} else {
				k.acquire(k.key())
			}
			continue
		}
		if k.r.Float64() < k.w.Expire {
			// Sleep until the lease has surely expired.
			k.sleep(time.Duration(k.maxExp-k.w.Recorder.Now()) + time.Duration(k.r.Int63n(int64(200*time.Millisecond))))
			if k.stopped() {
				return
			}
		}
		switch p := k.r.Float64(); {
		case p < 0.30:
			k.update()
		case p < 0.36:
			k.remove()
		case p < 0.45:
			k.keepAlive()
		case p < 0.60:
			k.leaseGet()
		case p < 0.68:
			k.publicGet(k.key())
		case p < 0.88:
			k.release(false)
		default:
			k.release(true)
		}
	}
}

// read is a reader's loop: public gets of random keys.
func (k *worker) read() {
	for !k.stopped() {
		k.sleep(time.Duration(1 + k.r.Int63n(int64(k.w.Think))))
		if k.stopped() {
			return
		}
		k.publicGet(k.key())
	}
}

func (k *worker) record(in Input, a attempt, out Output, attempts int) {
	out.Status, out.Code = a.status, a.code
	op := Op{Client: k.id, Input: in, Output: out, Node: k.node, Attempts: attempts}
	if a.err != nil {
		op.Err = a.err.Error()
	}
	k.w.Recorder.Add(op)
	if a.status == StatusFail && a.code == "dial" {
		k.sleep(time.Duration(50+k.r.Intn(100)) * time.Millisecond) // the node is down
	}
}

func (k *worker) ctx(extra time.Duration) (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.Background(), k.w.Timeout+extra)
}

// leaseInput fills in the lease an operation speaks for.
func (k *worker) leaseInput(kind Kind) Input {
	return Input{Kind: kind, Key: k.lease.Key, Lease: k.name, LeaseMinExp: k.minExp, LeaseMaxExp: k.maxExp}
}

// retry runs one attempt of fn, and again (up to three times in all) while
// the outcome is ambiguous: acquires (same idempotency key) and releases
// (answered from the recorded decision) are safe to repeat.
func (k *worker) retry(kind Kind, fn func() error) ([]attempt, attempt) {
	var as []attempt
	for {
		as = append(as, classify(kind, fn()))
		if as[len(as)-1].status != StatusUnknown || len(as) >= 3 {
			return as, combine(as)
		}
		time.Sleep(time.Duration(50+k.r.Intn(200)) * time.Millisecond)
	}
}

func (k *worker) acquire(key string) {
	k.seq++
	idem := fmt.Sprintf("lin-%d-c%d-%d", k.w.Seed, k.id, k.seq)
	rec := k.w.Recorder
	ttl, keep := k.w.TTL, k.r.Float64() < k.w.Keep
	if keep {
		ttl = time.Second
	}
	in := Input{Kind: KindAcquire, Key: key, TTL: int64(ttl), Call: rec.Now()}
	var l *client.Lease
	block := int64(k.w.Block / time.Second)
	if k.r.Float64() < 0.4 {
		block = -1 // do not wait: answered at once
	}
	as, a := k.retry(KindAcquire, func() error {
		ctx, cancel := k.ctx(k.w.Block)
		defer cancel()
		var err error
		l, err = k.c.AcquireWithKey(ctx, wire.AcquireRequest{Key: key, Owner: fmt.Sprintf("c%d", k.id),
			TTLSeconds: int64(ttl / time.Second), BlockSecs: block}, idem)
		return err
	})
	in.Return = rec.Now()
	var out Output
	if a.status == StatusOK {
		out.Lease, out.Token, out.Version = rec.LeaseName(l.LeaseID), l.FencingToken, l.Version
		k.lease, k.name = l, out.Lease
		k.minExp, k.maxExp = in.Call+in.TTL-Slack, in.Return+in.TTL+Slack
		k.ttl, k.ttlSure = ttl, true
		k.ver, k.etag = l.Version, l.StateETag
	}
	k.record(in, a, out, len(as))
	if a.status == StatusOK && keep {
		k.keepAcross()
	}
}

// keepAcross naps, keeps the lease alive and sleeps on past the expiry the
// keepalive replaced, but not up to the one it set.
func (k *worker) keepAcross() {
	k.sleep(time.Duration(200+k.r.Intn(250)) * time.Millisecond)
	if k.stopped() || k.lease == nil {
		return
	}
	old := k.maxExp
	if !k.keepAlive() {
		return
	}
	from, to := old+int64(20*time.Millisecond), min(k.minExp-int64(100*time.Millisecond), old+int64(250*time.Millisecond))
	if from < to {
		k.sleep(time.Duration(from + k.r.Int63n(to-from) - k.w.Recorder.Now()))
	}
}

// keepAlive extends the lease by its TTL or, now and then, by a second
// more (up to the workload's TTL), and reports whether it was answered ok.
func (k *worker) keepAlive() bool {
	in := k.leaseInput(KindKeepAlive)
	ttl, ask := k.ttl, time.Duration(0) // 0: the lease's own TTL
	if !k.ttlSure || k.r.Float64() < 0.5 {
		if k.r.Float64() < 0.3 && ttl < k.w.TTL {
			ttl += time.Second
		}
		ask = ttl
	}
	in.TTL = int64(ttl)
	ctx, cancel := k.ctx(0)
	defer cancel()
	in.Call = k.w.Recorder.Now()
	_, err := k.c.KeepAlive(ctx, k.lease.Ref(), ask)
	in.Return = k.w.Recorder.Now()
	a := classify(KindKeepAlive, err)
	switch a.status {
	case StatusOK:
		k.minExp, k.maxExp = max(k.minExp, in.Call+in.TTL-Slack), min(in.Return+Slack, k.maxExp)+in.TTL
		k.ttl, k.ttlSure = ttl, true
	case StatusUnknown:
		k.maxExp += in.TTL
		if ttl > k.ttl {
			k.ttl, k.ttlSure = ttl, false
		}
	}
	k.record(in, a, Output{}, 1)
	k.afterLeaseOp(a)
	return a.status == StatusOK
}

// afterLeaseOp forgets a lease the server no longer honours.
func (k *worker) afterLeaseOp(a attempt) {
	if a.status == StatusFail && leaseGone(a.code) {
		k.lease = nil
	}
}

// conditions guards an update or removal now and then with the version,
// the ETag or both of the holder's view as this client last saw it, and
// now and then with a wrong one.
func (k *worker) conditions(in *Input) client.Conditions {
	var cond client.Conditions
	if k.r.Float64() < 0.6 {
		return cond
	}
	p := k.r.Float64()
	if p < 0.65 {
		in.HasIfVersion, in.IfVersion = true, k.ver
		if k.r.Float64() < 0.2 {
			in.IfVersion += int64(1 - 2*k.r.Intn(2))
			if in.IfVersion < 0 {
				in.IfVersion = 1
			}
		}
		cond.IfVersion = &in.IfVersion
	}
	if p >= 0.45 {
		in.HasIfETag, in.IfETag = true, k.etag
		if k.r.Float64() < 0.2 {
			if in.IfETag == "" {
				in.IfETag = ETag(`{"v":"never"}`)
			} else {
				in.IfETag = ""
			}
		}
		// Quotes are optional; "" names the empty ETag of no document.
		cond.IfETag = in.IfETag
		if in.IfETag == "" || k.r.Float64() < 0.3 {
			cond.IfETag = `"` + in.IfETag + `"`
		}
	}
	return cond
}

// conflict notes the holder's view a refused condition was compared with.
func (k *worker) conflict(a attempt, out *Output) {
	var ce *client.Error
	if a.status == StatusFail && errors.As(a.err, &ce) && (a.code == "version_conflict" || a.code == "etag_mismatch") {
		out.CurrentVersion, out.CurrentETag = ce.Envelope.CurrentVersion, ce.Envelope.CurrentETag
		k.ver, k.etag = out.CurrentVersion, out.CurrentETag
	}
}

func (k *worker) update() {
	k.seq++
	in := k.leaseInput(KindUpdate)
	in.Value = fmt.Sprintf(`{"v":"c%d-%d"}`, k.id, k.seq)
	cond := k.conditions(&in)
	ctx, cancel := k.ctx(0)
	defer cancel()
	in.Call = k.w.Recorder.Now()
	res, err := k.c.Update(ctx, k.lease.Ref(), []byte(in.Value), cond)
	in.Return = k.w.Recorder.Now()
	a := classify(KindUpdate, err)
	var out Output
	if a.status == StatusOK {
		out.Version = res.NewVersion
		k.ver, k.etag = res.NewVersion, res.NewStateETag
	}
	k.conflict(a, &out)
	k.record(in, a, out, 1)
	k.afterLeaseOp(a)
}

func (k *worker) remove() {
	in := k.leaseInput(KindRemove)
	cond := k.conditions(&in)
	ctx, cancel := k.ctx(0)
	defer cancel()
	in.Call = k.w.Recorder.Now()
	res, err := k.c.Remove(ctx, k.lease.Ref(), cond)
	in.Return = k.w.Recorder.Now()
	a := classify(KindRemove, err)
	var out Output
	if a.status == StatusOK {
		out.Removed, out.Version = res.Removed, res.NewVersion
		k.ver = res.NewVersion
		if res.Removed {
			k.etag = ""
		}
	}
	k.conflict(a, &out)
	k.record(in, a, out, 1)
	k.afterLeaseOp(a)
}

func docOutput(d *client.Document) Output {
	out := Output{Exists: d.Exists, Version: d.Version}
	if d.Exists {
		out.Value = string(d.Body)
	}
	return out
}

func (k *worker) leaseGet() {
	in := k.leaseInput(KindLeaseGet)
	ctx, cancel := k.ctx(0)
	defer cancel()
	in.Call = k.w.Recorder.Now()
	d, err := k.c.Get(ctx, k.lease.Ref())
	in.Return = k.w.Recorder.Now()
	a := classify(KindLeaseGet, err)
	var out Output
	if a.status == StatusOK {
		out = docOutput(d)
		k.ver, k.etag = d.Version, d.ETag
	}
	k.record(in, a, out, 1)
	k.afterLeaseOp(a)
}

func (k *worker) publicGet(key string) {
	in := Input{Kind: KindPublicGet, Key: key}
	ctx, cancel := k.ctx(0)
	defer cancel()
	in.Call = k.w.Recorder.Now()
	d, err := k.c.GetPublic(ctx, "", key)
	in.Return = k.w.Recorder.Now()
	a := classify(KindPublicGet, err)
	var out Output
	if a.status == StatusOK {
		out = docOutput(d)
	}
	k.record(in, a, out, 1)
}

func (k *worker) release(rollback bool) {
	in := k.leaseInput(KindRelease)
	in.Rollback = rollback
	in.Call = k.w.Recorder.Now()
	ref := k.lease.Ref()
	as, a := k.retry(KindRelease, func() error {
		ctx, cancel := k.ctx(0)
		defer cancel()
		_, err := k.c.Release(ctx, ref, rollback)
		return err
	})
	in.Return = k.w.Recorder.Now()
	k.record(in, a, Output{}, len(as))
	k.lease = nil // whatever happened, this client is done with it
}

// Finish anchors the end of the history once the cluster has healed, as
// one more client (id Clients+Readers) talking to any node that answers
// (dialed directly, not through Dial). For each key it reads the committed
// document: every acknowledged commit must be visible. Then it acquires the
// key and reads it with the new lease. The clients left their last leases
// to run out (and abandoned their queued acquires), so every key must be
// granted within a TTL and a wait: a lease that outlives its TTL (an expiry
// nobody sweeps) fails here. The grants and reads go into the history, so
// the model checks what those expiries did: a token above every earlier
// one, and the committed version and document untouched by the
// transactions they rolled back.
func (w *Workload) Finish(within time.Duration) error {
	tr := &http.Transport{DialContext: (&net.Dialer{Timeout: time.Second}).DialContext, TLSClientConfig: w.TLS}
	defer tr.CloseIdleConnections()
	var cs []*client.Client
	for _, ep := range w.Endpoints {
		c, err := client.New(ep, client.WithRetry(0), client.WithHTTPClient(&http.Client{Transport: tr}))
		if err != nil {
			return err
		}
		cs = append(cs, c)
	}
	deadline := time.Now().Add(within)
	for _, key := range w.Keys {
		if err := w.finalRead(cs, key, deadline); err != nil {
			return fmt.Errorf("%s: no node answered a public read within %s: %w", key, within, err)
		}
		if err := w.finalAcquire(cs, key, deadline); err != nil {
			return fmt.Errorf("%s: nothing granted within %s after the clients stopped, whose leases last %s: %w", key, within, w.TTL, err)
		}
	}
	return nil
}

// finalOp records an operation of the client of Finish, which talked to
// node i.
func (w *Workload) finalOp(i int, in Input, a attempt, out Output, attempts int) {
	out.Status, out.Code = a.status, a.code
	op := Op{Client: w.Clients + w.Readers, Input: in, Output: out, Attempts: attempts}
	if i < len(w.Names) {
		op.Node = w.Names[i]
	}
	if a.err != nil {
		op.Err = a.err.Error()
	}
	w.Recorder.Add(op)
}

// finalRead reads key's committed document through the first node of cs
// that answers before deadline.
func (w *Workload) finalRead(cs []*client.Client, key string, deadline time.Time) error {
	rec := w.Recorder
	for n := 0; ; n++ {
		i := n % len(cs)
		ctx, cancel := context.WithTimeout(context.Background(), w.Timeout)
		in := Input{Kind: KindPublicGet, Key: key, Call: rec.Now()}
		d, err := cs[i].GetPublic(ctx, "", key)
		in.Return = rec.Now()
		cancel()
		if err == nil {
			w.finalOp(i, in, attempt{status: StatusOK}, docOutput(d), 1)
			return nil
		}
		if time.Now().After(deadline) {
			return err
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// finalAcquire acquires key, waiting for it, through the nodes of cs in
// turn until one grants it (one operation, one idempotency key), and reads
// it with the lease.
func (w *Workload) finalAcquire(cs []*client.Client, key string, deadline time.Time) error {
	rec := w.Recorder
	block := w.TTL + w.Block + time.Second
	in := Input{Kind: KindAcquire, Key: key, TTL: int64(w.TTL), Call: rec.Now()}
	var as []attempt
	var l *client.Lease
	var err error
	i := 0
	for n := 0; ; n++ {
		i = n % len(cs)
		ctx, cancel := context.WithTimeout(context.Background(), block+w.Timeout)
		l, err = cs[i].AcquireWithKey(ctx, wire.AcquireRequest{Key: key, Owner: "final", TTLSeconds: int64(w.TTL / time.Second),
			BlockSecs: int64(block / time.Second)}, fmt.Sprintf("lin-%d-final-%s", w.Seed, key))
		cancel()
		as = append(as, classify(KindAcquire, err))
		if err == nil || time.Now().After(deadline) {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	in.Return = rec.Now()
	var out Output
	if err == nil {
		out.Lease, out.Token, out.Version = rec.LeaseName(l.LeaseID), l.FencingToken, l.Version
	}
	w.finalOp(i, in, combine(as), out, len(as))
	if err != nil {
		return err
	}
	get := Input{Kind: KindLeaseGet, Key: key, Lease: out.Lease, LeaseMinExp: in.Call + in.TTL - Slack,
		LeaseMaxExp: in.Return + in.TTL + Slack}
	for n := i; ; n++ {
		j := n % len(cs)
		ctx, cancel := context.WithTimeout(context.Background(), w.Timeout)
		get.Call = rec.Now()
		d, err := cs[j].Get(ctx, l.Ref())
		get.Return = rec.Now()
		cancel()
		a := classify(KindLeaseGet, err)
		var out Output
		if err == nil {
			out = docOutput(d)
		}
		w.finalOp(j, get, a, out, 1)
		if a.status != StatusUnknown && !notReached(a.code) {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("reading it with the new lease: %w", err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

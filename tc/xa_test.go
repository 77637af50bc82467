package tc_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/rs/xid"
	"go.uber.org/goleak"

	"github.com/raftlockd/raftlockd/auth"
	"github.com/raftlockd/raftlockd/client"
	"github.com/raftlockd/raftlockd/config"
	"github.com/raftlockd/raftlockd/fsm"
	"github.com/raftlockd/raftlockd/internal/testcluster"
	"github.com/raftlockd/raftlockd/internal/testutil"
	"github.com/raftlockd/raftlockd/server"
	"github.com/raftlockd/raftlockd/wire"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m, goleak.IgnoreTopFunction("github.com/hashicorp/raft.(*NetworkTransport).listen"))
}

// xaConfig shortens the coordinator's retries so that failures show within
// a test's patience.
func xaConfig(cfg *config.Server) {
	cfg.TCFanoutTimeout = time.Second
	cfg.TCFanoutAttempts = 3
	cfg.TCFanoutBaseDelay = 20 * time.Millisecond
	cfg.TCFanoutMaxDelay = 200 * time.Millisecond
}

// island is a single-node raftlockd cluster with its own backend hash,
// on fixed loopback addresses so that it can be stopped and started again.
type island struct {
	t    *testing.T
	name string
	cfg  config.Server
	srv  *server.Server
	url  string       // what other islands register (the server, or a proxy in front of it)
	ca   *auth.Bundle // the island's CA
	// operator is a server certificate of the island's CA: the tests act
	// as the island's applications, as its coordinator's clients, as
	// other islands and as its operator, and a server certificate may
	// call every endpoint.
	operator *auth.Bundle
}

// startIsland starts an island whose CA is the shared test CA.
func startIsland(t *testing.T, name string, opts ...func(*config.Server)) *island {
	t.Helper()
	return startIslandOf(t, name, testutil.CA(t), opts...)
}

// startIslandOf starts an island whose node holds a server bundle of ca.
func startIslandOf(t *testing.T, name string, ca *auth.Bundle, opts ...func(*config.Server)) *island {
	t.Helper()
	cfg := testutil.Config(t, t.TempDir())
	cfg.NodeID = name
	cfg.Listen, cfg.RaftListen, cfg.GossipListen = testutil.FreeAddr(t), testutil.FreeAddr(t), testutil.FreeAddr(t)
	xaConfig(&cfg)
	for _, o := range opts {
		o(&cfg)
	}
	host, _, err := net.SplitHostPort(cfg.Listen)
	if err != nil {
		t.Fatal(err)
	}
	cfg.Bundle = testutil.ServerBundle(t, cfg.DataDir, ca, host)
	is := &island{t: t, name: name, cfg: cfg, ca: ca, operator: testutil.OperatorBundle(t, ca)}
	is.start()
	is.url = is.srv.URL()
	return is
}

func (is *island) start() {
	is.t.Helper()
	is.srv = testutil.StartServer(is.t, is.cfg)
	testutil.WaitFor(is.t, 10*time.Second, is.name+" to name itself", func() bool { return is.hash() != "" })
}

func (is *island) stop() {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_ = is.srv.Close(ctx)
}

func (is *island) hash() string { return is.srv.Node().BackendHash() }

func (is *island) client() *client.Client {
	c, err := client.New(is.srv.URL(), client.WithRetry(0), client.WithBundle(is.operator))
	if err != nil {
		is.t.Fatal(err)
	}
	return c
}

func (is *island) applied() uint64 { return is.srv.Node().FSM().Applied() }

func (is *island) view(fn func(v *fsm.View)) {
	_ = is.srv.Node().FSM().View(func(v *fsm.View) error { fn(v); return nil })
}

func (is *island) record(txn string) *fsm.TxnRecord {
	var t *fsm.TxnRecord
	is.view(func(v *fsm.View) { t = v.Txn(txn) })
	return t
}

// register makes every island know every other island's endpoint.
func register(t *testing.T, islands ...*island) {
	t.Helper()
	ctx := context.Background()
	for _, at := range islands {
		for _, other := range islands {
			if _, err := at.client().RMRegister(ctx, wire.TCRMRegisterRequest{BackendHash: other.hash(), Endpoint: other.url}, false); err != nil {
				t.Fatalf("register %s at %s: %v", other.name, at.name, err)
			}
		}
	}
}

func acquire(t *testing.T, c *client.Client, key, txn, owner string) *client.Lease {
	t.Helper()
	l, err := c.Acquire(context.Background(), wire.AcquireRequest{Key: key, Owner: owner, TTLSeconds: 60, BlockSecs: -1, TxnID: txn})
	if err != nil {
		t.Fatalf("acquire %s: %v", key, err)
	}
	return l
}

func stage(t *testing.T, l *client.Lease, doc string) {
	t.Helper()
	if _, err := l.Update(context.Background(), []byte(doc), client.Conditions{}); err != nil {
		t.Fatalf("update %s: %v", l.Key, err)
	}
}

func publicDoc(t *testing.T, c *client.Client, key string) string {
	t.Helper()
	d, err := c.GetPublic(context.Background(), "", key)
	if err != nil {
		t.Fatalf("get %s: %v", key, err)
	}
	return string(d.Body)
}

func part(key string, is *island) wire.TxnParticipant {
	return wire.TxnParticipant{Namespace: wire.DefaultNamespace, Key: key, BackendHash: is.hash()}
}

func wantCode(t *testing.T, err error, status int, code string) *client.Error {
	t.Helper()
	var ce *client.Error
	if !errors.As(err, &ce) || ce.Status != status || ce.Envelope.Code != code {
		t.Fatalf("want %d %s, got %v", status, code, err)
	}
	return ce
}

// clean asserts that an island holds no staged writes and no leases once
// its sweeper ran.
func clean(t *testing.T, islands ...*island) {
	t.Helper()
	for _, is := range islands {
		testutil.WaitFor(t, 10*time.Second, is.name+" to hold no staged writes and no leases", func() bool {
			var staged, leases int
			is.view(func(v *fsm.View) { staged, leases = v.StagedWrites(), 0; leases, _ = v.Counts() })
			return staged == 0 && leases == 0
		})
	}
}

// crossClient calls to's API as from's nodes do: presenting from's server
// certificate and checking to's against to's CA.
func crossClient(t *testing.T, from, to *island) *client.Client {
	t.Helper()
	cfg := auth.ClientConfig(from.operator)
	cfg.RootCAs = to.operator.Roots()
	c, err := client.New(to.srv.URL(), client.WithRetry(0), client.WithTLS(cfg))
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// trust puts the CAs of others on is's trust list through its API.
func trust(t *testing.T, is *island, others ...*island) {
	t.Helper()
	for _, o := range others {
		if _, err := is.client().Trust(context.Background(), "island "+o.name, o.ca.Cert); err != nil {
			t.Fatalf("trust %s's CA at %s: %v", o.name, is.name, err)
		}
	}
}

// Islands of different CAs: b's CA is not a's and c's. Until each island
// has put the other CA on its trust list (POST /v1/tc/trust) they refuse
// each other's servers; then they coordinate transactions as islands of
// one CA do, each node checking the other island's server against its own
// CA and its trust list.
func TestCommitAndRollbackAcrossIslands(t *testing.T) {
	caB, err := auth.NewCA(auth.IssueOptions{Name: "island b CA"})
	if err != nil {
		t.Fatal(err)
	}
	a, b, c := startIsland(t, "a"), startIslandOf(t, "b", caB), startIsland(t, "c")
	ctx := context.Background()
	for _, p := range [][2]*island{{a, b}, {b, a}} {
		_, err := crossClient(t, p[0], p[1]).TxnStatus(ctx, xid.New().String())
		wantCode(t, err, http.StatusUnauthorized, "certificate_untrusted")
	}
	trust(t, a, b)
	trust(t, c, b)
	trust(t, b, a) // a's CA is c's
	if list, err := b.client().TrustedCAs(ctx); err != nil || len(list.Trusted) != 1 ||
		list.Trusted[0].Fingerprint != auth.Fingerprint(a.ca.Cert) {
		t.Fatalf("b's trust list: %+v %v", list, err)
	}
	for _, p := range [][2]*island{{a, b}, {b, a}, {b, c}} {
		_, err := crossClient(t, p[0], p[1]).TxnStatus(ctx, xid.New().String())
		wantCode(t, err, http.StatusNotFound, "not_found")
	}
	register(t, a, b, c)

	// An island no RM is registered for is refused before anything is
	// recorded, whatever the decision.
	for _, state := range []string{wire.TxnStatePending, wire.TxnStateCommit, wire.TxnStateRollback} {
		txn := xid.New().String()
		nowhere := part("kx", a)
		nowhere.BackendHash = "nowhere"
		_, err := a.client().TxnDecide(ctx, wire.TxnDecisionRequest{TxnID: txn, State: state,
			Participants: []wire.TxnParticipant{part("ka", a), nowhere}})
		wantCode(t, err, http.StatusConflict, "txn_backend_unknown")
		if rec := a.record(txn); rec != nil {
			t.Fatalf("%s with an unknown island recorded %+v", state, rec)
		}
	}

	// Commit: three keys on three islands, one transaction.
	txn := xid.New().String()
	la, lb, lc := acquire(t, a.client(), "ka", txn, "w"), acquire(t, b.client(), "kb", txn, "w"), acquire(t, c.client(), "kc", txn, "w")
	stage(t, la, `{"n":"a1"}`)
	stage(t, lb, `{"n":"b1"}`)
	stage(t, lc, `{"n":"c1"}`)
	out, err := a.client().TxnDecide(ctx, wire.TxnDecisionRequest{TxnID: txn, State: wire.TxnStateCommit,
		Participants: []wire.TxnParticipant{part("ka", a), part("kb", b), part("kc", c)}})
	if err != nil || out.State != wire.TxnStateCommit || out.TCTerm == 0 {
		t.Fatalf("commit: %+v, %v", out, err)
	}
	for _, x := range []struct {
		is  *island
		key string
		doc string
	}{{a, "ka", `{"n":"a1"}`}, {b, "kb", `{"n":"b1"}`}, {c, "kc", `{"n":"c1"}`}} {
		if got := publicDoc(t, x.is.client(), x.key); got != x.doc {
			t.Fatalf("%s/%s after commit: %q", x.is.name, x.key, got)
		}
	}
	st, err := a.client().TxnStatus(ctx, txn)
	if err != nil || st.State != fsm.TxnCommit || len(st.Acked) != 2 || st.TCTerm != out.TCTerm {
		t.Fatalf("coordinator status: %+v, %v", st, err)
	}
	if r := b.record(txn); r == nil || r.State != fsm.TxnCommit || r.Home != a.hash() {
		t.Fatalf("b's record: %+v", r)
	}
	// A repeated commit answers the decision; a rollback cannot change it.
	if out, err := a.client().TxnDecide(ctx, wire.TxnDecisionRequest{TxnID: txn, State: wire.TxnStateCommit}); err != nil || out.State != fsm.TxnCommit {
		t.Fatalf("repeat: %+v %v", out, err)
	}
	_, err = a.client().TxnDecide(ctx, wire.TxnDecisionRequest{TxnID: txn, State: wire.TxnStateRollback})
	wantCode(t, err, http.StatusConflict, "txn_committed")
	_, err = a.client().TxnDecide(ctx, wire.TxnDecisionRequest{TxnID: txn, State: wire.TxnStatePending})
	wantCode(t, err, http.StatusConflict, "txn_committed")

	// Rollback: staged writes vanish everywhere, leases are freed.
	txn2 := xid.New().String()
	la, lb = acquire(t, a.client(), "ka", txn2, "w"), acquire(t, b.client(), "kb", txn2, "w")
	stage(t, la, `{"n":"a2"}`)
	stage(t, lb, `{"n":"b2"}`)
	out, err = a.client().TxnDecide(ctx, wire.TxnDecisionRequest{TxnID: txn2, State: wire.TxnStateRollback,
		Participants: []wire.TxnParticipant{part("ka", a), part("kb", b)}})
	if err != nil || out.State != fsm.TxnRollback {
		t.Fatalf("rollback: %+v, %v", out, err)
	}
	if publicDoc(t, a.client(), "ka") != `{"n":"a1"}` || publicDoc(t, b.client(), "kb") != `{"n":"b1"}` {
		t.Fatal("rollback changed committed documents")
	}

	// A release of a lease whose transaction spans islands commits it
	// through the coordinator.
	txn3 := xid.New().String()
	la, lb = acquire(t, a.client(), "ka", txn3, "w"), acquire(t, b.client(), "kb", txn3, "w")
	stage(t, la, `{"n":"a3"}`)
	stage(t, lb, `{"n":"b3"}`)
	if _, err := a.client().TxnDecide(ctx, wire.TxnDecisionRequest{TxnID: txn3, State: wire.TxnStatePending,
		Participants: []wire.TxnParticipant{part("ka", a), part("kb", b)}}); err != nil {
		t.Fatalf("prepare: %v", err)
	}
	// The island of kb is not the coordinator: its release goes home.
	if err := lb.Release(ctx, false); err != nil {
		t.Fatalf("release through the resource manager's island: %v", err)
	}
	if publicDoc(t, a.client(), "ka") != `{"n":"a3"}` || publicDoc(t, b.client(), "kb") != `{"n":"b3"}` {
		t.Fatal("release did not commit on both islands")
	}
	clean(t, a, b, c)
}

func TestLeaderKilledBeforeFanoutReplaysOnNewLeader(t *testing.T) {
	home := testcluster.Start(t, 3, testcluster.Configure(xaConfig))
	// b is reached only through a link the test can stall: it publishes
	// the proxy as its endpoint.
	bAddr := testutil.FreeAddr(t)
	link := testutil.NewProxy(t, bAddr)
	b := startIsland(t, "b", func(c *config.Server) { c.Listen, c.APIAdvertise = bAddr, link.URL() })
	b.url = link.URL()
	ctx := context.Background()
	leader := home.WaitLeader(10 * time.Second)
	hc, err := client.New(home.URL(leader), client.WithRetry(15*time.Second), client.WithHTTPClient(home.OperatorHTTPClient("operator")))
	if err != nil {
		t.Fatal(err)
	}
	hash := home.Nodes[leader].Server.Node().BackendHash()
	for i := range home.Nodes {
		if _, err := b.client().RMRegister(ctx, wire.TCRMRegisterRequest{BackendHash: hash, Endpoint: home.URL(i)}, false); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := hc.RMRegister(ctx, wire.TCRMRegisterRequest{BackendHash: b.hash(), Endpoint: b.url}, false); err != nil {
		t.Fatal(err)
	}

	txn := xid.New().String()
	la, lb := acquire(t, hc, "ka", txn, "w"), acquire(t, b.client(), "kb", txn, "w")
	stage(t, la, `{"v":1}`)
	stage(t, lb, `{"v":1}`)
	if _, err := hc.TxnDecide(ctx, wire.TxnDecisionRequest{TxnID: txn, State: wire.TxnStatePending,
		Participants: []wire.TxnParticipant{{Key: "ka"}, part("kb", b)}}); err != nil {
		t.Fatalf("prepare: %v", err)
	}
	// The link to b stalls; the commit is recorded and applied at home,
	// then its fan-out hangs.
	link.Hold()
	follower := (leader + 1) % 3
	done := make(chan error, 1)
	go func() {
		// Sent to a follower: it forwards to the leader.
		_, err := home.Operator(follower).TxnDecide(ctx, wire.TxnDecisionRequest{TxnID: txn, State: wire.TxnStateCommit})
		done <- err
	}()
	testutil.WaitFor(t, 10*time.Second, "the commit to be recorded on every home node and its fan-out to stall", func() bool {
		for _, n := range home.Nodes {
			var r *fsm.TxnRecord
			_ = n.Server.Node().FSM().View(func(v *fsm.View) error { r = v.Txn(txn); return nil })
			if r == nil || r.State != fsm.TxnCommit {
				return false
			}
		}
		return link.Held() > 0
	})
	if r := b.record(txn); r == nil || r.State != fsm.TxnPending {
		t.Fatalf("b applied before the fan-out: %+v", r)
	}
	// Killed: no draining, no leadership hand-off.
	home.Crash(leader)
	<-done
	link.Release()
	next := home.WaitLeader(10 * time.Second)
	if next == leader {
		t.Fatal("the killed node still leads")
	}
	testutil.WaitFor(t, 15*time.Second, "the new leader to replay the commit on b", func() bool {
		r := b.record(txn)
		return r != nil && r.State == fsm.TxnCommit
	})
	if got := publicDoc(t, b.client(), "kb"); got != `{"v":1}` {
		t.Fatalf("kb after replay: %q", got)
	}
	testutil.WaitFor(t, 10*time.Second, "the new leader to record that b applied the decision", func() bool {
		st, err := home.Operator(next).TxnStatus(ctx, txn)
		return err == nil && len(st.Acked) == 1 && st.TCTerm > 0
	})
	clean(t, b)
	testutil.WaitFor(t, 10*time.Second, "the home island to hold no staged writes and no leases", func() bool {
		var staged, leases int
		_ = home.Nodes[next].Server.Node().FSM().View(func(v *fsm.View) error {
			staged = v.StagedWrites()
			leases, _ = v.Counts()
			return nil
		})
		return staged == 0 && leases == 0
	})
}

func TestStaleTermRejectedAndRepeatedApplyChangesNothing(t *testing.T) {
	a, b := startIsland(t, "a"), startIsland(t, "b")
	register(t, a, b)
	ctx := context.Background()
	txn := xid.New().String()
	lb := acquire(t, b.client(), "kb", txn, "w")
	stage(t, lb, `{"v":2}`)
	if _, err := a.client().TxnDecide(ctx, wire.TxnDecisionRequest{TxnID: txn, State: wire.TxnStatePending,
		Participants: []wire.TxnParticipant{part("kb", b)}}); err != nil {
		t.Fatal(err)
	}
	var term uint64
	b.view(func(v *fsm.View) { term = v.TCTerm(a.hash()) })
	if term == 0 {
		t.Fatal("b did not record the coordinator's term")
	}
	apply := func(term uint64, target string) error {
		_, err := b.client().TxnApply(ctx, wire.TxnDecisionRequest{TxnID: txn, State: wire.TxnStateCommit, TCTerm: term,
			TCBackendHash: a.hash(), TargetBackendHash: target, Participants: []wire.TxnParticipant{part("kb", b)}})
		return err
	}
	wantCode(t, apply(term-1, ""), http.StatusConflict, "tc_term_stale")
	wantCode(t, apply(term, "another-island"), http.StatusConflict, "txn_backend_mismatch")
	// lockd's local apply (no coordinating island) needs a recorded decision.
	_, err := b.client().TxnApply(ctx, wire.TxnDecisionRequest{TxnID: xid.New().String(), State: wire.TxnStateCommit})
	wantCode(t, err, http.StatusConflict, "txn_pending")
	if r := b.record(txn); r.State != fsm.TxnPending {
		t.Fatalf("rejected applies changed the record: %+v", r)
	}

	if _, err := a.client().TxnDecide(ctx, wire.TxnDecisionRequest{TxnID: txn, State: wire.TxnStateCommit}); err != nil {
		t.Fatal(err)
	}
	if got := publicDoc(t, b.client(), "kb"); got != `{"v":2}` {
		t.Fatalf("kb: %q", got)
	}
	before := b.applied()
	var h1, h2 []byte
	b.view(func(v *fsm.View) { h1 = v.Hash() })
	if err := apply(term, b.hash()); err != nil {
		t.Fatalf("repeated apply: %v", err)
	}
	b.view(func(v *fsm.View) { h2 = v.Hash() })
	if b.applied() != before || string(h1) != string(h2) {
		t.Fatalf("a repeated apply changed the island: index %d -> %d", before, b.applied())
	}
	// The opposite decision is refused.
	_, err = b.client().TxnApply(ctx, wire.TxnDecisionRequest{TxnID: txn, State: wire.TxnStateRollback, TCTerm: term,
		TCBackendHash: a.hash()})
	wantCode(t, err, http.StatusConflict, "txn_committed")
	clean(t, a, b)
}

// twoIslandTxn starts islands a and b, registered with each other, and a
// transaction holding ka on a and kb on b, with doc staged on both.
func twoIslandTxn(t *testing.T, doc string) (a, b *island, txn string, la, lb *client.Lease) {
	t.Helper()
	a, b = startIsland(t, "a"), startIsland(t, "b")
	register(t, a, b)
	txn = xid.New().String()
	la, lb = acquire(t, a.client(), "ka", txn, "w"), acquire(t, b.client(), "kb", txn, "w")
	stage(t, la, doc)
	stage(t, lb, doc)
	return a, b, txn, la, lb
}

// committedWithBDown prepares a two-island transaction staging doc, stops
// b and commits: 502 txn_fanout_failed.
func committedWithBDown(t *testing.T, doc string) (a, b *island, txn string) {
	t.Helper()
	a, b, txn, _, _ = twoIslandTxn(t, doc)
	if _, err := a.client().TxnDecide(context.Background(), wire.TxnDecisionRequest{TxnID: txn, State: wire.TxnStatePending,
		Participants: []wire.TxnParticipant{part("ka", a), part("kb", b)}}); err != nil {
		t.Fatal(err)
	}
	b.stop()
	_, err := a.client().TxnDecide(context.Background(), wire.TxnDecisionRequest{TxnID: txn, State: wire.TxnStateCommit})
	wantCode(t, err, http.StatusBadGateway, "txn_fanout_failed")
	return a, b, txn
}

func TestIslandDownDuringFanoutAnswers502ThenReplayCompletes(t *testing.T) {
	a, b, txn := committedWithBDown(t, `{"v":3}`)
	ctx := context.Background()
	st, err := a.client().TxnStatus(ctx, txn)
	if err != nil || st.State != fsm.TxnCommit || len(st.Acked) != 0 {
		t.Fatalf("the decision must stay recorded: %+v %v", st, err)
	}
	if got := publicDoc(t, a.client(), "ka"); got != `{"v":3}` {
		t.Fatalf("the home island applies first: ka = %q", got)
	}
	b.start()
	testutil.WaitFor(t, 15*time.Second, "the resolver to replay the decision on b", func() bool {
		r := b.record(txn)
		return r != nil && r.State == fsm.TxnCommit
	})
	if got := publicDoc(t, b.client(), "kb"); got != `{"v":3}` {
		t.Fatalf("kb after replay: %q", got)
	}
	out, err := a.client().TxnReplay(ctx, txn)
	if err != nil || out.State != fsm.TxnCommit {
		t.Fatalf("replay: %+v %v", out, err)
	}
	clean(t, a, b)
}

// A decision retried after txn_fanout_failed is sent again to the islands
// still missing it: 502 again while one is down, and once it is back the
// answer comes after it applied the decision.
func TestARetriedDecisionAfterAFailedFanoutIsSentAgain(t *testing.T) {
	a, b, txn := committedWithBDown(t, `{"v":4}`)
	ctx := context.Background()
	commit := wire.TxnDecisionRequest{TxnID: txn, State: wire.TxnStateCommit}
	_, err := a.client().TxnDecide(ctx, commit)
	wantCode(t, err, http.StatusBadGateway, "txn_fanout_failed")
	_, err = a.client().TxnDecide(ctx, wire.TxnDecisionRequest{TxnID: txn, State: wire.TxnStateRollback})
	wantCode(t, err, http.StatusConflict, "txn_committed")
	b.start()
	if out, err := a.client().TxnDecide(ctx, commit); err != nil || out.State != fsm.TxnCommit {
		t.Fatalf("commit retried with b back: %+v %v", out, err)
	}
	if r := b.record(txn); r == nil || r.State != fsm.TxnCommit {
		t.Fatalf("b answered the retry without the decision applied: %+v", r)
	}
	if st, err := a.client().TxnStatus(ctx, txn); err != nil || !slices.Contains(st.Acked, b.hash()) {
		t.Fatalf("status after the retry: %+v %v", st, err)
	}
	clean(t, a, b)
}

// A participant island that does not answer a prepare is a transient
// failure: 503 txn_island_unreachable with a retry hint, the transaction
// stays open (nothing recorded as failed for good), and the same prepare
// succeeds once the island is back.
func TestPrepareWithAnIslandDownIsTransientAndRetried(t *testing.T) {
	a, b, txn, _, _ := twoIslandTxn(t, `{"v":4}`)
	ctx := context.Background()
	prepare := wire.TxnDecisionRequest{TxnID: txn, State: wire.TxnStatePending,
		Participants: []wire.TxnParticipant{part("ka", a), part("kb", b)}}
	b.stop()
	_, err := a.client().TxnDecide(ctx, prepare)
	ce := wantCode(t, err, http.StatusServiceUnavailable, "txn_island_unreachable")
	if ce.Envelope.RetryAfter <= 0 {
		t.Fatalf("no retry hint: %+v", ce.Envelope)
	}
	if r := a.record(txn); r != nil && r.State != fsm.TxnPending {
		t.Fatalf("a transient failure decided the transaction: %+v", r)
	}
	if d, err := a.client().Describe(ctx, "", "ka"); err != nil || d.TxnID != txn {
		t.Fatalf("ka must still be held by the transaction: %+v %v", d, err)
	}
	b.start()
	if out, err := a.client().TxnDecide(ctx, prepare); err != nil || out.State != fsm.TxnPending {
		t.Fatalf("prepare retried once b is back: %+v %v", out, err)
	}
	if out, err := a.client().TxnDecide(ctx, wire.TxnDecisionRequest{TxnID: txn, State: wire.TxnStateCommit}); err != nil || out.State != fsm.TxnCommit {
		t.Fatalf("commit: %+v %v", out, err)
	}
	for _, is := range []*island{a, b} {
		if got := publicDoc(t, is.client(), "k"+is.name); got != `{"v":4}` {
			t.Fatalf("k%s after commit: %q", is.name, got)
		}
	}
	clean(t, a, b)
}

func TestPendingPastExpiryRollsBackEverywhere(t *testing.T) {
	a, b := startIsland(t, "a"), startIsland(t, "b")
	register(t, a, b)
	ctx := context.Background()
	txn := xid.New().String()
	lb := acquire(t, b.client(), "kb", txn, "w")
	stage(t, lb, `{"v":"staged"}`)
	// ka is free: the prepare locks it for the transaction.
	if _, err := a.client().TxnDecide(ctx, wire.TxnDecisionRequest{TxnID: txn, State: wire.TxnStatePending, Owner: "w",
		ExpiresAtUnix: time.Now().Add(2 * time.Second).Unix(),
		Participants:  []wire.TxnParticipant{part("ka", a), part("kb", b)}}); err != nil {
		t.Fatal(err)
	}
	d, err := a.client().Describe(ctx, "", "ka")
	if err != nil || d.TxnID != txn {
		t.Fatalf("ka must be locked for the transaction: %+v %v", d, err)
	}
	testutil.WaitFor(t, 15*time.Second, "the expired pending decision to roll back on both islands", func() bool {
		ra, rb := a.record(txn), b.record(txn)
		return ra != nil && ra.State == fsm.TxnRollback && rb != nil && rb.State == fsm.TxnRollback
	})
	if r := a.record(txn); r.Reason != fsm.ReasonPresumedAbort {
		t.Fatalf("reason: %+v", r)
	}
	if d, _ := b.client().GetPublic(ctx, "", "kb"); len(d.Body) != 0 {
		t.Fatalf("a staged write survived the rollback: %q", d.Body)
	}
	clean(t, a, b)
	// Nothing can revive it.
	_, err = a.client().TxnDecide(ctx, wire.TxnDecisionRequest{TxnID: txn, State: wire.TxnStateCommit})
	wantCode(t, err, http.StatusConflict, "txn_rolled_back")
}

// requests counts the requests an island served on endpoint.
func requests(t *testing.T, is *island, endpoint string) float64 {
	t.Helper()
	mfs, err := is.srv.Registry().Gather()
	if err != nil {
		t.Fatal(err)
	}
	var n float64
	for _, mf := range mfs {
		if mf.GetName() != "raftlockd_http_requests_total" {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "endpoint" && l.GetValue() == endpoint {
					n += m.GetCounter().GetValue()
				}
			}
		}
	}
	return n
}

func TestLockConflictFailsFastAndForGood(t *testing.T) {
	a, b := startIsland(t, "a"), startIsland(t, "b")
	register(t, a, b)
	ctx := context.Background()
	holder := acquire(t, b.client(), "kb", xid.New().String(), "worker-1")

	txn := xid.New().String()
	acquire(t, a.client(), "ka", txn, "worker-2")
	before := b.applied()
	_, err := a.client().TxnDecide(ctx, wire.TxnDecisionRequest{TxnID: txn, State: wire.TxnStateCommit,
		Participants: []wire.TxnParticipant{part("ka", a), part("kb", b)}})
	ce := wantCode(t, err, http.StatusConflict, "txn_lock_conflict")
	if ce.Envelope.Detail != "LOCKED:worker-1" {
		t.Fatalf("detail: %q", ce.Envelope.Detail)
	}
	if b.applied() != before {
		t.Fatalf("the participant ran a Raft round for the conflict: %d -> %d", before, b.applied())
	}
	if r := a.record(txn); r.State != fsm.TxnRollback || r.Reason != fsm.ReasonLockConflict {
		t.Fatalf("the coordinator must record the rollback: %+v", r)
	}
	// b holds nothing for the transaction: it counts as done without being
	// sent the rollback, so no replay ever runs a Raft round there.
	if r := a.record(txn); !slices.Contains(r.Acked, b.hash()) || len(r.Unacked()) != 0 {
		t.Fatalf("the conflicting island must count as done: %+v", r)
	}
	// The failure is final and answered from the record: b is not asked.
	prepares := requests(t, b, "/v1/txn/prepare")
	for _, state := range []string{wire.TxnStateCommit, wire.TxnStatePending} {
		_, err = a.client().TxnDecide(ctx, wire.TxnDecisionRequest{TxnID: txn, State: state,
			Participants: []wire.TxnParticipant{part("ka", a), part("kb", b)}})
		if ce := wantCode(t, err, http.StatusConflict, "txn_lock_conflict"); ce.Envelope.Detail != "LOCKED:worker-1" {
			t.Fatalf("cached failure detail: %q", ce.Envelope.Detail)
		}
	}
	if got := requests(t, b, "/v1/txn/prepare"); got != prepares {
		t.Fatalf("a retry reached the participant again (%v -> %v prepares)", prepares, got)
	}
	// Its lease on ka was released by the rollback.
	if d, err := a.client().Describe(ctx, "", "ka"); err != nil || d.LeaseID != "" {
		t.Fatalf("ka still held: %+v %v", d, err)
	}

	// The same owner re-entering its own key is no conflict.
	mine := xid.New().String()
	if out, err := a.client().TxnDecide(ctx, wire.TxnDecisionRequest{TxnID: mine, State: wire.TxnStateCommit, Owner: "worker-1",
		Participants: []wire.TxnParticipant{part("kb", b)}}); err != nil || out.State != fsm.TxnCommit {
		t.Fatalf("re-entrant: %+v %v", out, err)
	}
	// A conflict on the coordinator's own island fails the same way.
	txn2 := xid.New().String()
	other := acquire(t, a.client(), "kx", xid.New().String(), "worker-3")
	_, err = a.client().TxnDecide(ctx, wire.TxnDecisionRequest{TxnID: txn2, State: wire.TxnStatePending,
		Participants: []wire.TxnParticipant{part("kx", a), part("kb", b)}})
	if ce := wantCode(t, err, http.StatusConflict, "txn_lock_conflict"); ce.Envelope.Detail != "LOCKED:worker-3" {
		t.Fatalf("local conflict detail: %q", ce.Envelope.Detail)
	}
	for _, l := range []*client.Lease{holder, other} {
		if err := l.Release(ctx, true); err != nil {
			t.Fatal(err)
		}
	}
	clean(t, a, b)
}

// An island that answers a lock conflict while the transaction holds
// something there already (a lease it took on that island, with a staged
// write) rolls that back itself before answering: the coordinator counts
// it as done, and nothing the transaction staged there commits later
// through a release of its lease.
func TestAConflictOnAnIslandWhereTheTransactionHoldsKeysRollsThemBack(t *testing.T) {
	a, b := startIsland(t, "a"), startIsland(t, "b")
	register(t, a, b)
	ctx := context.Background()
	busy := acquire(t, b.client(), "busy", xid.New().String(), "other")
	txn := xid.New().String()
	la, lb := acquire(t, a.client(), "ka", txn, "me"), acquire(t, b.client(), "kb", txn, "me")
	stage(t, la, `{"v":1}`)
	stage(t, lb, `{"v":1}`)
	_, err := a.client().TxnDecide(ctx, wire.TxnDecisionRequest{TxnID: txn, State: wire.TxnStateCommit, Owner: "me",
		Participants: []wire.TxnParticipant{part("ka", a), part("kb", b), part("busy", b)}})
	if ce := wantCode(t, err, http.StatusConflict, "txn_lock_conflict"); ce.Envelope.Detail != "LOCKED:other" {
		t.Fatalf("detail: %q", ce.Envelope.Detail)
	}
	if r := b.record(txn); r == nil || r.State != fsm.TxnRollback {
		t.Fatalf("b's record of the transaction: %+v", r)
	}
	if err := lb.Release(ctx, false); err == nil {
		t.Fatal("a release on b committed a transaction its coordinator rolled back")
	}
	if got := publicDoc(t, b.client(), "kb"); got != "" {
		t.Fatalf("kb on b: %q", got)
	}
	if d, err := b.client().Describe(ctx, "", "kb"); err != nil || d.LeaseID != "" {
		t.Fatalf("kb still held: %+v %v", d, err)
	}
	if err := busy.Release(ctx, true); err != nil {
		t.Fatal(err)
	}
	clean(t, a, b)
}

// A commit names participants the transaction never locked, also when
// it has a record already (a lease it took): one held by another
// transaction is a lock conflict, as it is for a prepare.
func TestACommitOfATransactionWithLeasesChecksItsOtherParticipants(t *testing.T) {
	a := startIsland(t, "a")
	ctx := context.Background()
	held := acquire(t, a.client(), "held", xid.New().String(), "alice")
	txn := xid.New().String()
	acquire(t, a.client(), "mine", txn, "bob")
	_, err := a.client().TxnDecide(ctx, wire.TxnDecisionRequest{TxnID: txn, State: wire.TxnStateCommit, Owner: "bob",
		Participants: []wire.TxnParticipant{part("mine", a), part("held", a)}})
	if ce := wantCode(t, err, http.StatusConflict, "txn_lock_conflict"); ce.Envelope.Detail != "LOCKED:alice" {
		t.Fatalf("detail: %q", ce.Envelope.Detail)
	}
	if r := a.record(txn); r.State != fsm.TxnRollback || r.Reason != fsm.ReasonLockConflict {
		t.Fatalf("record: %+v", r)
	}
	if d, err := a.client().Describe(ctx, "", "held"); err != nil || d.LeaseID != held.LeaseID {
		t.Fatalf("alice's lease: %+v %v", d, err)
	}
	if err := held.Release(ctx, true); err != nil {
		t.Fatal(err)
	}
	clean(t, a)
}

func TestIslandsLearnEachOtherFromPeers(t *testing.T) {
	// a knows b, c knows b: both introduce themselves to b, which passes
	// each on to the other.
	bAddr := testutil.FreeAddr(t)
	b := startIsland(t, "b", func(c *config.Server) { c.Listen = bAddr })
	peer := func(c *config.Server) { c.TCPeers = []string{"https://" + bAddr} }
	a, c := startIsland(t, "a", peer), startIsland(t, "c", peer)
	all := []*island{a, b, c}
	testutil.WaitFor(t, 30*time.Second, "every island to know every island", func() bool {
		for _, is := range all {
			list, err := is.client().RMList(context.Background())
			if err != nil || len(list.Backends) != 3 {
				return false
			}
		}
		return true
	})
	// Registering with an island that cannot be reached records the entry
	// but answers 502.
	ctx := context.Background()
	// b and c are reachable: the new island's entry reaches them.
	if _, err := a.client().RMRegister(ctx, wire.TCRMRegisterRequest{BackendHash: "gone", Endpoint: "https://" + testutil.FreeAddr(t)}, false); err != nil {
		t.Fatalf("register gone: %v", err)
	}
	// The next change cannot reach "gone".
	_, err := a.client().RMRegister(ctx, wire.TCRMRegisterRequest{BackendHash: "other", Endpoint: "https://" + testutil.FreeAddr(t)}, false)
	wantCode(t, err, http.StatusBadGateway, "tc_rm_replication_failed")
	list, err := a.client().RMList(ctx)
	if err != nil || len(list.Backends) != 5 {
		t.Fatalf("the entry must stay recorded: %+v %v", list, err)
	}
	// Bad registrations are 4xx.
	_, err = a.client().RMRegister(ctx, wire.TCRMRegisterRequest{BackendHash: "x", Endpoint: "ftp://nowhere"}, false)
	wantCode(t, err, http.StatusBadRequest, "invalid_endpoint")
	_, err = a.client().RMRegister(ctx, wire.TCRMRegisterRequest{Endpoint: "http://127.0.0.1:1"}, false)
	wantCode(t, err, http.StatusBadRequest, "invalid_params")
}

func TestInDoubtParticipantAsksItsCoordinator(t *testing.T) {
	a, b := startIsland(t, "a"), startIsland(t, "b")
	register(t, a, b)
	ctx := context.Background()
	term := a.srv.Node().Term()

	// A prepare that a's coordinator never recorded (it crashed before, or
	// the request is forged): b locks kb and holds it until it hears a
	// decision, past the lease's expiry (whole seconds: at least 2 s from
	// now, so that the checks below run before it).
	txn := xid.New().String()
	expires := time.Now().Add(3 * time.Second).Unix()
	out, err := b.client().TxnPrepare(ctx, wire.TxnDecisionRequest{TxnID: txn, TCTerm: term, TCBackendHash: a.hash(),
		ExpiresAtUnix: expires, Owner: "w", Participants: []wire.TxnParticipant{part("kb", b)}})
	if err != nil || out.State != fsm.TxnPending {
		t.Fatalf("prepare: %+v %v", out, err)
	}
	// A second prepare of the same participants changes nothing.
	before := b.applied()
	if _, err := b.client().TxnPrepare(ctx, wire.TxnDecisionRequest{TxnID: txn, TCTerm: term, TCBackendHash: a.hash(),
		ExpiresAtUnix: expires, Owner: "w", Participants: []wire.TxnParticipant{part("kb", b)}}); err != nil {
		t.Fatal(err)
	}
	if b.applied() != before {
		t.Fatal("a repeated prepare ran a Raft round")
	}
	// Another transaction cannot take kb meanwhile.
	_, err = b.client().Acquire(ctx, wire.AcquireRequest{Key: "kb", Owner: "x", BlockSecs: -1})
	wantCode(t, err, http.StatusConflict, "waiting")
	// Once due, b asks a, which has no record: a records the rollback
	// (presumed abort) and b applies it.
	testutil.WaitFor(t, 15*time.Second, "b to learn the rollback from a", func() bool {
		r := b.record(txn)
		return r != nil && r.State == fsm.TxnRollback
	})
	if r := a.record(txn); r == nil || r.State != fsm.TxnRollback || r.Reason != fsm.ReasonPresumedAbort {
		t.Fatalf("a must record the presumed abort: %+v", r)
	}
	free, err := b.client().Acquire(ctx, wire.AcquireRequest{Key: "kb", Owner: "x", BlockSecs: -1})
	if err != nil {
		t.Fatalf("kb must be free again: %v", err)
	}
	// A prepare for a decided transaction answers the decision.
	out, err = b.client().TxnPrepare(ctx, wire.TxnDecisionRequest{TxnID: txn, TCTerm: term, TCBackendHash: a.hash(),
		ExpiresAtUnix: time.Now().Add(time.Minute).Unix(), Participants: []wire.TxnParticipant{part("kb", b)}})
	if err != nil || out.State != fsm.TxnRollback {
		t.Fatalf("prepare after the decision: %+v %v", out, err)
	}
	// Malformed requests are 4xx.
	for _, req := range []wire.TxnDecisionRequest{
		{TxnID: "not-an-xid", TCTerm: term, TCBackendHash: a.hash(), ExpiresAtUnix: time.Now().Add(time.Minute).Unix()},
		{TxnID: xid.New().String(), TCBackendHash: a.hash(), ExpiresAtUnix: time.Now().Add(time.Minute).Unix()},
		{TxnID: xid.New().String(), TCTerm: term, TCBackendHash: b.hash(), ExpiresAtUnix: time.Now().Add(time.Minute).Unix()},
	} {
		_, err := b.client().TxnPrepare(ctx, req)
		var ce *client.Error
		if !errors.As(err, &ce) || ce.Status < 400 || ce.Status >= 500 {
			t.Fatalf("prepare %+v: want 4xx, got %v", req, err)
		}
	}
	if err := free.Release(ctx, true); err != nil {
		t.Fatal(err)
	}
	clean(t, a, b)
}

// An RM prepare that names no expiry holds its participants for
// --tc-pending-ttl (30 s here), as a decide does.
func TestAPrepareWithoutAnExpiryHoldsForThePendingTTL(t *testing.T) {
	a, b := startIsland(t, "a"), startIsland(t, "b")
	register(t, a, b)
	txn := xid.New().String()
	out, err := b.client().TxnPrepare(context.Background(), wire.TxnDecisionRequest{TxnID: txn, TCTerm: a.srv.Node().Term(),
		TCBackendHash: a.hash(), Owner: "w", Participants: []wire.TxnParticipant{part("kb", b)}})
	if err != nil || out.State != fsm.TxnPending {
		t.Fatalf("prepare: %+v %v", out, err)
	}
	r := b.record(txn)
	if left := time.Until(time.UnixMilli(r.ExpiresAt)); left < 20*time.Second || left > 31*time.Second {
		t.Fatalf("the prepare holds for %v", left)
	}
	if _, err := a.client().TxnDecide(context.Background(), wire.TxnDecisionRequest{TxnID: txn, State: wire.TxnStateRollback,
		Participants: []wire.TxnParticipant{part("kb", b)}}); err != nil {
		t.Fatal(err)
	}
	clean(t, a, b)
}

func TestTransactionEndpointsRejectBadInput(t *testing.T) {
	a := startIsland(t, "a")
	base := a.srv.URL()
	hc := testutil.HTTPClient(t, a.operator)
	before := a.applied()
	for _, tc := range []struct{ method, path, body string }{
		{"POST", "/v1/txn/decide", `{"txn_id":"x","state":"commit"}`},
		{"POST", "/v1/txn/decide", `{"txn_id":"` + xid.New().String() + `","state":"maybe"}`},
		{"POST", "/v1/txn/decide", `{"txn_id":"` + xid.New().String() + `","state":"commit","participants":[{"namespace":".txns","key":"k"}]}`},
		{"POST", "/v1/txn/decide", `{"txn_id":"` + xid.New().String() + `","state":"commit","participants":[{"key":""}]}`},
		{"POST", "/v1/txn/decide", `{"txn_id":"` + xid.New().String() + `","state":"pending","expires_at_unix":-1}`},
		{"POST", "/v1/txn/decide", `{"txn_id":`},
		{"POST", "/v1/txn/decide", `{"txn_id":"` + xid.New().String() + `","bogus":1}`},
		{"POST", "/v1/txn/replay", `{"txn_id":"nope"}`},
		{"GET", "/v1/txn/status?txn_id=nope", ``},
		{"POST", "/v1/txn/commit", `{"txn_id":"` + xid.New().String() + `","state":"rollback"}`},
		{"POST", "/v1/tc/rm/register", `{"backend_hash":"has space","endpoint":"http://127.0.0.1:1"}`},
		{"GET", "/v1/txn/decide", ``},
	} {
		req, _ := http.NewRequest(tc.method, base+tc.path, strings.NewReader(tc.body))
		resp, err := hc.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		var env struct {
			Error string `json:"error"`
		}
		_ = json.NewDecoder(resp.Body).Decode(&env)
		resp.Body.Close()
		if resp.StatusCode < 400 || resp.StatusCode >= 500 || env.Error == "" {
			t.Errorf("%s %s %s: %d %q, want a 4xx with a code", tc.method, tc.path, tc.body, resp.StatusCode, env.Error)
		}
	}
	_, err := a.client().TxnStatus(context.Background(), xid.New().String())
	wantCode(t, err, http.StatusNotFound, "not_found")
	if a.applied() != before {
		t.Fatalf("rejected requests changed the state: %d -> %d", before, a.applied())
	}
}

// A release of a prepared participant whose coordinating island is down
// answers a retryable 503, and works once the island is back.
func TestReleaseWhileTheCoordinatorIsDown(t *testing.T) {
	a, b, txn, _, lb := twoIslandTxn(t, `{"v":9}`)
	ctx := context.Background()
	if _, err := a.client().TxnDecide(ctx, wire.TxnDecisionRequest{TxnID: txn, State: wire.TxnStatePending,
		Participants: []wire.TxnParticipant{part("ka", a), part("kb", b)}}); err != nil {
		t.Fatal(err)
	}
	a.stop()
	err := lb.Release(ctx, false)
	wantCode(t, err, http.StatusServiceUnavailable, "txn_island_unreachable")
	a.start()
	if err := lb.Release(ctx, false); err != nil {
		t.Fatalf("release once the coordinator is back: %v", err)
	}
	if publicDoc(t, a.client(), "ka") != `{"v":9}` || publicDoc(t, b.client(), "kb") != `{"v":9}` {
		t.Fatal("the release did not commit on both islands")
	}
	clean(t, a, b)
}

// The leader's resolver replays to every island at once: an island whose
// link stalls (every call to it waits out the fan-out timeout) holds up
// only the decisions it is part of, not the replay to an island that has
// come back.
func TestAStalledIslandDoesNotHoldUpReplaysToOthers(t *testing.T) {
	const stalled = 8
	a, c := startIsland(t, "a"), startIsland(t, "c")
	bAddr := testutil.FreeAddr(t)
	link := testutil.NewProxy(t, bAddr)
	b := startIsland(t, "b", func(cfg *config.Server) { cfg.Listen, cfg.APIAdvertise = bAddr, link.URL() })
	b.url = link.URL()
	register(t, a, b, c)
	ctx := context.Background()
	prepare := func(other *island, i int) string {
		txn := xid.New().String()
		ka, ko := fmt.Sprintf("ka%d", i), fmt.Sprintf("k%s%d", other.name, i)
		la, lo := acquire(t, a.client(), ka, txn, "w"), acquire(t, other.client(), ko, txn, "w")
		stage(t, la, `{"v":1}`)
		stage(t, lo, `{"v":1}`)
		if _, err := a.client().TxnDecide(ctx, wire.TxnDecisionRequest{TxnID: txn, State: wire.TxnStatePending,
			Participants: []wire.TxnParticipant{part(ka, a), part(ko, other)}}); err != nil {
			t.Fatalf("prepare %s: %v", txn, err)
		}
		return txn
	}
	var toB []string
	for i := range stalled {
		toB = append(toB, prepare(b, i))
	}
	toC := prepare(c, stalled)

	// b's link stalls and c goes down; the commits are recorded (b's
	// first, so that the resolver meets them first) and not applied there.
	link.Hold()
	c.stop()
	var wg sync.WaitGroup
	errs := make([]error, len(toB))
	for i, txn := range toB {
		wg.Go(func() {
			_, errs[i] = a.client().TxnDecide(ctx, wire.TxnDecisionRequest{TxnID: txn, State: wire.TxnStateCommit})
		})
	}
	testutil.WaitFor(t, 10*time.Second, "b's commits to be recorded", func() bool {
		for _, txn := range toB {
			if r := a.record(txn); r == nil || r.State != fsm.TxnCommit {
				return false
			}
		}
		return true
	})
	_, err := a.client().TxnDecide(ctx, wire.TxnDecisionRequest{TxnID: toC, State: wire.TxnStateCommit})
	wantCode(t, err, http.StatusBadGateway, "txn_fanout_failed")
	wg.Wait()
	for _, err := range errs {
		wantCode(t, err, http.StatusBadGateway, "txn_fanout_failed")
	}

	// Each replay to b waits out its attempts (3 x 1s); one after the
	// other, eight of them would keep c waiting for half a minute.
	c.start()
	start := time.Now()
	testutil.WaitFor(t, 12*time.Second, "the resolver to replay the commit on c while b stalls", func() bool {
		r := c.record(toC)
		return r != nil && r.State == fsm.TxnCommit
	})
	t.Logf("replayed on c %s after it came back", time.Since(start).Round(time.Millisecond))
	if r := b.record(toB[0]); r == nil || r.State != fsm.TxnPending {
		t.Fatalf("b applied through a stalled link: %+v", r)
	}

	link.Release()
	testutil.WaitFor(t, 30*time.Second, "the resolver to replay every commit on b once its link flows", func() bool {
		for _, txn := range toB {
			if r := b.record(txn); r == nil || r.State != fsm.TxnCommit {
				return false
			}
		}
		return true
	})
	clean(t, a, b, c)
}

// The registry's anti-entropy tells every island at once: an island that
// does not answer (each call waits out the fan-out timeout) does not keep
// the others from learning of a new island.
func TestAStalledIslandDoesNotHoldUpTheRegistry(t *testing.T) {
	bAddr := testutil.FreeAddr(t)
	link := testutil.NewProxy(t, bAddr)
	b := startIsland(t, "b", func(cfg *config.Server) { cfg.Listen = bAddr })
	link.Hold()
	c := startIsland(t, "c")
	// a introduces itself to its configured peers, the one behind the
	// stalled link first; c learns of a only that way.
	a := startIsland(t, "a", func(cfg *config.Server) {
		cfg.TCPeers = []string{link.URL(), c.url}
		cfg.TCFanoutTimeout = 5 * time.Second
	})
	// An island a learns of (b, directly) starts its next round at once.
	start := time.Now()
	if _, err := a.client().RMRegister(context.Background(), wire.TCRMRegisterRequest{BackendHash: b.hash(), Endpoint: b.url}, false); err != nil {
		t.Fatal(err)
	}
	testutil.WaitFor(t, 4*time.Second, "c to learn of a while the link to b stalls", func() bool {
		list, err := c.client().RMList(context.Background())
		if err != nil {
			return false
		}
		for _, e := range list.Backends {
			if e.BackendHash == a.hash() {
				return true
			}
		}
		return false
	})
	t.Logf("c learned of a %s after a learned of b", time.Since(start).Round(time.Millisecond))
	testutil.WaitFor(t, 5*time.Second, "a's call through the stalled link", func() bool { return link.Held() > 0 })
	link.Release()
}

// A decision that names the participants of its recorded pending decision
// again counts each once: a commit of the same 600 participants is not
// refused as holding more than the limit.
func TestADecideThatNamesItsParticipantsAgainCountsThemOnce(t *testing.T) {
	a := startIsland(t, "a")
	ctx := context.Background()
	txn := xid.New().String()
	var ps []wire.TxnParticipant
	for i := range 600 {
		ps = append(ps, part(fmt.Sprintf("k%03d", i), a))
	}
	for _, state := range []string{wire.TxnStatePending, wire.TxnStateCommit} {
		if out, err := a.client().TxnDecide(ctx, wire.TxnDecisionRequest{TxnID: txn, State: state,
			Participants: ps}); err != nil || out.State != state {
			t.Fatalf("%s of 600 participants: %+v %v", state, out, err)
		}
	}
	if rec := a.record(txn); len(rec.Participants) != 600 {
		t.Fatalf("the record holds %d participants, want 600", len(rec.Participants))
	}
}

// A replay of a transaction that holds live leases here but has no pending
// decision recorded answers pending: it does not presume the transaction
// aborted, which its leases' expiry would do, and its holder can still
// commit it.
func TestReplayLeavesATransactionWithoutAPendingDecisionToItsLeases(t *testing.T) {
	a := startIsland(t, "a")
	ctx := context.Background()
	txn := xid.New().String()
	la := acquire(t, a.client(), "ka", txn, "w")
	stage(t, la, `{"a":1}`)
	if out, err := a.client().TxnReplay(ctx, txn); err != nil || out.State != wire.TxnStatePending {
		t.Fatalf("replay of a live transaction: %+v %v", out, err)
	}
	if err := la.Release(ctx, false); err != nil {
		t.Fatalf("commit after the replay: %v", err)
	}
	if doc := publicDoc(t, a.client(), "ka"); doc != `{"a":1}` {
		t.Fatalf("ka holds %q after the commit", doc)
	}
}

// An island that prepared a transaction and answers a renewed pending
// decision (one more key) with a lock conflict still holds what it prepared
// the first time: the rollback that follows is sent there too, and frees it.
func TestAConflictOnARenewedPrepareRollsBackWhatTheIslandPreparedBefore(t *testing.T) {
	a, b := startIsland(t, "a"), startIsland(t, "b")
	register(t, a, b)
	ctx := context.Background()
	txn := xid.New().String()
	exp := time.Now().Add(10 * time.Minute).Unix()
	if out, err := a.client().TxnDecide(ctx, wire.TxnDecisionRequest{TxnID: txn, State: wire.TxnStatePending,
		ExpiresAtUnix: exp, Participants: []wire.TxnParticipant{part("kb1", b)}}); err != nil || out.State != wire.TxnStatePending {
		t.Fatalf("pending: %+v %v", out, err)
	}
	acquire(t, b.client(), "kb2", xid.New().String(), "other")
	_, err := a.client().TxnDecide(ctx, wire.TxnDecisionRequest{TxnID: txn, State: wire.TxnStatePending,
		ExpiresAtUnix: exp, Participants: []wire.TxnParticipant{part("kb1", b), part("kb2", b)}})
	wantCode(t, err, http.StatusConflict, "txn_lock_conflict")
	deadline := time.Now().Add(10 * time.Second)
	for r := b.record(txn); r == nil || r.State != fsm.TxnRollback; r = b.record(txn) {
		if time.Now().After(deadline) {
			t.Fatalf("b was not told the rollback: %+v", r)
		}
		time.Sleep(20 * time.Millisecond)
	}
	if d, err := b.client().Describe(ctx, "", "kb1"); err != nil || d.LeaseID != "" {
		t.Fatalf("kb1 on b after the rollback: %+v %v", d, err)
	}
}

// registryHas reports whether is lists island backend in its registry.
func registryHas(t *testing.T, is *island, backend string) bool {
	t.Helper()
	list, err := is.client().RMList(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range list.Backends {
		if e.BackendHash == backend {
			return true
		}
	}
	return false
}

// removalMissedByB starts islands a and b, registers an endpoint of island
// "gone" through a, stops b and unregisters it through a, which answers
// tc_rm_replication_failed: b missed the removal.
func removalMissedByB(t *testing.T) (a, b *island, gone wire.TCRMRegisterRequest) {
	t.Helper()
	a, b = startIsland(t, "a"), startIsland(t, "b")
	register(t, a, b)
	return a, b, missRemoval(t, a, b)
}

// missRemoval registers an endpoint of island "gone" through a, stops b and
// unregisters it through a, which answers tc_rm_replication_failed: b
// missed the removal.
func missRemoval(t *testing.T, a, b *island) wire.TCRMRegisterRequest {
	t.Helper()
	ctx := context.Background()
	gone := wire.TCRMRegisterRequest{BackendHash: "gone", Endpoint: "https://" + testutil.FreeAddr(t)}
	if _, err := a.client().RMRegister(ctx, gone, false); err != nil {
		t.Fatal(err)
	}
	if !registryHas(t, b, gone.BackendHash) {
		t.Fatal("the registration was not passed on to b")
	}
	b.stop()
	_, err := a.client().RMRegister(ctx, gone, true)
	wantCode(t, err, http.StatusBadGateway, "tc_rm_replication_failed")
	return gone
}

// An island that was down when an endpoint was unregistered learns the
// removal from the next registry sync, without the operator retrying; the
// endpoint it introduces again when it comes back (its sync at start, and
// every sync after until it learns) is older than the removal, and the
// island that recorded the removal does not take it back.
func TestARegistryRemovalReachesTheIslandThatMissedIt(t *testing.T) {
	a, b, gone := removalMissedByB(t)
	b.start()
	stillGoneOnA := func() {
		t.Helper()
		if registryHas(t, a, gone.BackendHash) {
			t.Fatal("b brought the unregistered endpoint back on a")
		}
	}
	testutil.WaitFor(t, 20*time.Second, "the removal to reach b", func() bool {
		stillGoneOnA()
		return !registryHas(t, b, gone.BackendHash)
	})
	// Each of b's registry syncs calls a's register endpoint once for b's
	// own endpoint, and once more for the stale endpoint while b still has
	// it: three more calls span at least two syncs, the last one wholly
	// after b learned the removal.
	calls := requests(t, a, "/v1/tc/rm/register")
	testutil.WaitFor(t, 40*time.Second, "two more of b's registry syncs", func() bool {
		stillGoneOnA()
		return requests(t, a, "/v1/tc/rm/register") >= calls+3
	})
	stillGoneOnA()
	if registryHas(t, b, gone.BackendHash) {
		t.Fatal("the unregistered endpoint is back on b")
	}
}

// A registry change that answered tc_rm_replication_failed is passed on
// again when it is retried, even though it is recorded here already, with
// the time it was recorded: a retry answers 200 only once every island has
// it.
func TestARetriedRegistryChangeReachesTheIslandsItMissed(t *testing.T) {
	a, b, gone := removalMissedByB(t)
	ctx := context.Background()
	// b still has the entry: the retry must not pretend otherwise.
	_, err := a.client().RMRegister(ctx, gone, true)
	wantCode(t, err, http.StatusBadGateway, "tc_rm_replication_failed")
	b.start()
	testutil.WaitFor(t, 10*time.Second, "the retried unregister to answer 200", func() bool {
		_, err := a.client().RMRegister(ctx, gone, true)
		return err == nil
	})
	if registryHas(t, a, gone.BackendHash) || registryHas(t, b, gone.BackendHash) {
		t.Fatal("the unregistered endpoint is listed after the retry answered 200")
	}
}

// A replay on an island that prepared a transaction its coordinator has
// not decided yet answers pending, as the coordinator's own replay does,
// and leaves the participants prepared.
func TestReplayOnAPreparedIslandAnswersPendingWhileUndecided(t *testing.T) {
	a, b := startIsland(t, "a"), startIsland(t, "b")
	register(t, a, b)
	ctx := context.Background()
	txn := xid.New().String()
	stage(t, acquire(t, b.client(), "kb", txn, "w"), `{"v":1}`)
	if _, err := a.client().TxnDecide(ctx, wire.TxnDecisionRequest{TxnID: txn, State: wire.TxnStatePending,
		Participants: []wire.TxnParticipant{part("kb", b)}, ExpiresAtUnix: time.Now().Add(time.Minute).Unix()}); err != nil {
		t.Fatal(err)
	}
	for _, is := range []*island{a, b} {
		out, err := is.client().TxnReplay(ctx, txn)
		if err != nil || out.State != fsm.TxnPending {
			t.Fatalf("replay on %s: %+v %v; want pending", is.name, out, err)
		}
	}
	if r := b.record(txn); r == nil || r.State != fsm.TxnPending {
		t.Fatalf("b's record after the replay: %+v", r)
	}
	if _, err := a.client().TxnDecide(ctx, wire.TxnDecisionRequest{TxnID: txn, State: wire.TxnStateCommit}); err != nil {
		t.Fatal(err)
	}
	if out, err := b.client().TxnReplay(ctx, txn); err != nil || out.State != fsm.TxnCommit {
		t.Fatalf("replay on b after the commit: %+v %v", out, err)
	}
	clean(t, a, b)
}

// The registry's updated_at_unix is when it last changed, a change that
// removes an island's last endpoint (and with it the island) included.
func TestRegistryListIsUpdatedWhenAnIslandIsUnregistered(t *testing.T) {
	a := startIsland(t, "a")
	ctx := context.Background()
	gone := wire.TCRMRegisterRequest{BackendHash: "gone", Endpoint: "https://" + testutil.FreeAddr(t)}
	added, err := a.client().RMRegister(ctx, gone, false)
	if err != nil {
		t.Fatal(err)
	}
	testutil.WaitFor(t, 5*time.Second, "the next second", func() bool { return time.Now().Unix() > added.UpdatedAtUnix })
	removed, err := a.client().RMRegister(ctx, gone, true)
	if err != nil || removed.UpdatedAtUnix <= added.UpdatedAtUnix {
		t.Fatalf("unregister: %+v %v", removed, err)
	}
	list, err := a.client().RMList(ctx)
	if err != nil || list.UpdatedAtUnix < removed.UpdatedAtUnix {
		t.Fatalf("list after the unregister at %d: %+v %v", removed.UpdatedAtUnix, list, err)
	}
}

// As in lockd, a decide merges its participants with the record: naming an
// island's keys after the transaction was decided without them tells that
// island the decision, and the record lists them.
func TestADecideOnADecidedTransactionReachesTheIslandsItAdds(t *testing.T) {
	a, c := startIsland(t, "a"), startIsland(t, "c")
	register(t, a, c)
	testutil.WaitFor(t, 10*time.Second, "island a to follow this build's rules", func() bool {
		return a.srv.Node().FSM().Rules() >= fsm.EntryFormat
	})
	ctx := context.Background()
	txn := xid.New().String()
	la, lc := acquire(t, a.client(), "ka", txn, "w"), acquire(t, c.client(), "kc", txn, "w")
	stage(t, la, `{"n":"a1"}`)
	stage(t, lc, `{"n":"c1"}`)
	out, err := a.client().TxnDecide(ctx, wire.TxnDecisionRequest{TxnID: txn, State: wire.TxnStateCommit,
		Participants: []wire.TxnParticipant{part("ka", a)}})
	if err != nil || out.State != wire.TxnStateCommit {
		t.Fatalf("commit naming a's key only: %+v %v", out, err)
	}
	if got := publicDoc(t, c.client(), "kc"); got != "" {
		t.Fatalf("c applied a decision it was not named in: %q", got)
	}
	out, err = a.client().TxnDecide(ctx, wire.TxnDecisionRequest{TxnID: txn, State: wire.TxnStateCommit,
		Participants: []wire.TxnParticipant{part("ka", a), part("kc", c)}})
	if err != nil || out.State != wire.TxnStateCommit {
		t.Fatalf("commit naming c's key too: %+v %v", out, err)
	}
	if got := publicDoc(t, c.client(), "kc"); got != `{"n":"c1"}` {
		t.Fatalf("c's key after the second commit: %q", got)
	}
	st, err := a.client().TxnStatus(ctx, txn)
	if err != nil || len(st.Participants) != 2 || len(st.Acked) != 1 || st.Acked[0] != c.hash() {
		t.Fatalf("coordinator status: %+v, %v", st, err)
	}
	if r := c.record(txn); r == nil || r.State != fsm.TxnCommit || r.Home != a.hash() {
		t.Fatalf("c's record: %+v", r)
	}
	// The other decision still cannot be had, whatever it names; an island
	// no RM is registered for is refused, and the record stays as it was.
	_, err = a.client().TxnDecide(ctx, wire.TxnDecisionRequest{TxnID: txn, State: wire.TxnStateRollback,
		Participants: []wire.TxnParticipant{part("kz", c)}})
	wantCode(t, err, http.StatusConflict, "txn_committed")
	nowhere := part("kx", c)
	nowhere.BackendHash = "nowhere"
	_, err = a.client().TxnDecide(ctx, wire.TxnDecisionRequest{TxnID: txn, State: wire.TxnStateCommit,
		Participants: []wire.TxnParticipant{nowhere}})
	wantCode(t, err, http.StatusConflict, "txn_backend_unknown")
	if r := a.record(txn); len(r.Participants) != 2 || len(r.Unacked()) != 0 {
		t.Fatalf("a's record after the refused decide: %+v", r)
	}
	clean(t, a, c)
}

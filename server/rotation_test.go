package server_test

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/rpc"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/raftlockd/raftlockd/auth"
	"github.com/raftlockd/raftlockd/client"
	"github.com/raftlockd/raftlockd/cluster"
	"github.com/raftlockd/raftlockd/config"
	"github.com/raftlockd/raftlockd/errcode"
	"github.com/raftlockd/raftlockd/internal/testcluster"
	"github.com/raftlockd/raftlockd/internal/testutil"
	"github.com/raftlockd/raftlockd/wire"
)

// rotationLoad is a set of clients that acquire a key, store a document
// under the lease and release it, over and over, against every node of a
// cluster, each request on its own without retries: any request the
// cluster fails is counted. Every node has clients that keep their
// connections and clients that open a new one, with a new handshake, for
// every request. The clients' bundle can be replaced while they run (a new
// generation of clients), as an application does that reloads its
// certificate.
type rotationLoad struct {
	urls    []string
	gen     atomic.Pointer[loadGeneration]
	perNode []atomic.Int64 // successful requests sent to each node
	failed  atomic.Int64

	mu    sync.Mutex
	errs  []string
	gens  []*loadGeneration
	stop  chan struct{}
	wg    sync.WaitGroup
	once  sync.Once
	start time.Time
}

// loadGeneration is the clients of one bundle: per node, one that keeps
// its connections and one that does not.
type loadGeneration struct {
	name       string
	pooled     []*client.Client
	fresh      []*client.Client
	transports []*http.Transport
	ok         atomic.Int64
}

func startRotationLoad(t *testing.T, urls []string, workers int, b *auth.Bundle, name string) *rotationLoad {
	t.Helper()
	l := &rotationLoad{urls: urls, perNode: make([]atomic.Int64, len(urls)), stop: make(chan struct{}), start: time.Now()}
	l.use(t, name, b)
	t.Cleanup(l.halt)
	for w := range workers {
		l.wg.Add(1)
		go l.work(w)
	}
	return l
}

// use makes every later request go out with bundle b (new connections,
// presenting b's certificate and checking the nodes against b's CAs).
func (l *rotationLoad) use(t *testing.T, name string, b *auth.Bundle) *loadGeneration {
	t.Helper()
	g := &loadGeneration{name: name}
	for _, u := range l.urls {
		for _, fresh := range []bool{false, true} {
			tr := &http.Transport{TLSClientConfig: auth.ClientConfig(b), DisableKeepAlives: fresh,
				MaxIdleConnsPerHost: 16, IdleConnTimeout: 30 * time.Second}
			c, err := client.New(u, client.WithHTTPClient(&http.Client{Transport: tr, Timeout: 20 * time.Second}), client.WithRetry(0))
			if err != nil {
				t.Fatal(err)
			}
			g.transports = append(g.transports, tr)
			if fresh {
				g.fresh = append(g.fresh, c)
			} else {
				g.pooled = append(g.pooled, c)
			}
		}
	}
	l.mu.Lock()
	l.gens = append(l.gens, g)
	l.mu.Unlock()
	if old := l.gen.Swap(g); old != nil {
		for _, tr := range old.transports {
			tr.CloseIdleConnections()
		}
	}
	return g
}

func (l *rotationLoad) work(w int) {
	defer l.wg.Done()
	node, fresh := w%len(l.urls), (w/len(l.urls))%2 == 1
	fails := 0
	for i := 0; ; i++ {
		select {
		case <-l.stop:
			return
		default:
		}
		// A key left held by a failed request is not used again.
		key := fmt.Sprintf("rotation-%d-%d", w, fails)
		if !l.cycle(node, fresh, key, fmt.Sprintf("worker-%d", w), i) {
			fails++
		}
	}
}

// cycle acquires key on node, stores a document and releases the lease,
// each request with the clients of the moment.
func (l *rotationLoad) cycle(node int, fresh bool, key, owner string, i int) bool {
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	current := func() (*loadGeneration, *client.Client) {
		g := l.gen.Load()
		if fresh {
			return g, g.fresh[node]
		}
		return g, g.pooled[node]
	}
	g, c := current()
	lease, err := c.Acquire(ctx, wire.AcquireRequest{Key: key, Owner: owner, TTLSeconds: 30})
	if !l.record(g, node, "acquire", err) {
		return false
	}
	g, c = current()
	_, err = c.Update(ctx, lease.Ref(), fmt.Appendf(nil, `{"owner":%q,"i":%d}`, owner, i), client.Conditions{})
	if !l.record(g, node, "update", err) {
		return false
	}
	g, c = current()
	_, err = c.Release(ctx, lease.Ref(), false)
	return l.record(g, node, "release", err)
}

func (l *rotationLoad) record(g *loadGeneration, node int, op string, err error) bool {
	if err != nil {
		l.failed.Add(1)
		l.mu.Lock()
		if len(l.errs) < 20 {
			l.errs = append(l.errs, fmt.Sprintf("%s on node %d with the %s clients, %s after the start: %v",
				op, node, g.name, time.Since(l.start).Round(time.Millisecond), err))
		}
		l.mu.Unlock()
		return false
	}
	g.ok.Add(1)
	l.perNode[node].Add(1)
	return true
}

// halt stops the clients once their current requests are answered.
func (l *rotationLoad) halt() {
	l.once.Do(func() {
		close(l.stop)
		l.wg.Wait()
		l.mu.Lock()
		defer l.mu.Unlock()
		for _, g := range l.gens {
			for _, tr := range g.transports {
				tr.CloseIdleConnections()
			}
		}
	})
}

func (l *rotationLoad) total() int64 {
	var n int64
	for i := range l.perNode {
		n += l.perNode[i].Load()
	}
	return n
}

// failures fails the test if any request failed.
func (l *rotationLoad) failures(t *testing.T) {
	t.Helper()
	if n := l.failed.Load(); n > 0 {
		l.mu.Lock()
		defer l.mu.Unlock()
		t.Fatalf("%d requests failed (%d succeeded):\n%s", n, l.total(), strings.Join(l.errs, "\n"))
	}
}

// progress waits until every node has answered n more requests
// successfully, failing the test as soon as a request fails.
func (l *rotationLoad) progress(t *testing.T, n int64, what string) {
	t.Helper()
	base := make([]int64, len(l.perNode))
	for i := range l.perNode {
		base[i] = l.perNode[i].Load()
	}
	testutil.WaitFor(t, 30*time.Second, fmt.Sprintf("%d more requests on every node %s", n, what), func() bool {
		l.failures(t)
		for i := range l.perNode {
			if l.perNode[i].Load() < base[i]+n {
				return false
			}
		}
		return true
	})
}

// waitGeneration waits until the clients of g have had n requests answered.
func (l *rotationLoad) waitGeneration(t *testing.T, g *loadGeneration, n int64) {
	t.Helper()
	testutil.WaitFor(t, 30*time.Second, fmt.Sprintf("%d requests with the %s clients", n, g.name), func() bool {
		l.failures(t)
		return g.ok.Load() >= n
	})
}

// bundleClient is an SDK client for url presenting b that retries for
// retry; its idle connections are closed when the test ends.
func bundleClient(t *testing.T, url string, b *auth.Bundle, retry time.Duration) *client.Client {
	t.Helper()
	tr := &http.Transport{TLSClientConfig: auth.ClientConfig(b)}
	t.Cleanup(tr.CloseIdleConnections)
	c, err := client.New(url, client.WithHTTPClient(&http.Client{Transport: tr, Timeout: 20 * time.Second}), client.WithRetry(retry))
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// withCAs is b's certificate and key with the given CA certificates and
// gossip key.
func withCAs(b *auth.Bundle, gossipKey []byte, cas ...*x509.Certificate) *auth.Bundle {
	return &auth.Bundle{Cert: b.Cert, Key: b.Key, CAs: cas, GossipKey: gossipKey}
}

// nodeHosts are the names n's server certificates are issued for.
func nodeHosts(n *testcluster.Node) []string {
	return []string{"127.0.0.1", "::1", "localhost", hostOf(n.Config.Listen)}
}

// rotate replaces node i's bundle file with b, as an operator does (the
// new file written next to it and renamed into place), reloads the node and
// checks that it serves b's certificate on the API and the cluster port.
func rotate(t *testing.T, c *testcluster.Cluster, i int, b *auth.Bundle) {
	t.Helper()
	n := c.Nodes[i]
	if err := b.WriteFile(n.Config.Bundle); err != nil {
		t.Fatalf("replace %s's bundle: %v", n.Name, err)
	}
	if err := n.Server.Reload(); err != nil {
		t.Fatalf("reload %s: %v", n.Name, err)
	}
	want := auth.SerialOf(b.Cert)
	if got := apiSerial(t, n.Server.Addr(), b.Roots()); got != want {
		t.Fatalf("%s's API presents certificate %s after the reload, want %s", n.Name, got, want)
	}
	// A peer presenting the node's new certificate is served on the
	// cluster port (the forwarding channel), and sees that certificate.
	got, st, _, err := peerStats(n.Server.Node().RaftAddr(), auth.NewStaticSource(b).PeerClientConfig())
	if err != nil {
		t.Fatalf("%s's cluster port with its new certificate: %v", n.Name, err)
	}
	if got != want || st.NodeID != n.Name {
		t.Fatalf("%s's cluster port presents certificate %s (node %q) after the reload, want %s", n.Name, got, st.NodeID, want)
	}
}

// apiSerial is the serial of the certificate the API at addr presents,
// verified against roots.
func apiSerial(t *testing.T, addr string, roots *x509.CertPool) string {
	t.Helper()
	conn, err := tls.DialWithDialer(&net.Dialer{Timeout: 5 * time.Second}, "tcp", addr,
		&tls.Config{MinVersion: tls.VersionTLS12, RootCAs: roots})
	if err != nil {
		t.Fatalf("TLS to the API at %s: %v", addr, err)
	}
	defer conn.Close()
	return auth.SerialOf(conn.ConnectionState().PeerCertificates[0])
}

// peerStats connects to a node's cluster port as a peer with cfg (a
// peer's client configuration) and asks for its Raft status over the RPC
// channel. It returns the serial of the certificate the node presented and
// whether the TLS session was resumed.
func peerStats(addr string, cfg *tls.Config) (serial string, st cluster.Status, resumed bool, err error) {
	raw, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		return "", st, false, fmt.Errorf("dial %s: %w", addr, err)
	}
	conn := tls.Client(raw, cfg)
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(10 * time.Second))
	if err := conn.Handshake(); err != nil {
		return "", st, false, fmt.Errorf("handshake: %w", err)
	}
	cs := conn.ConnectionState()
	serial, resumed = auth.SerialOf(cs.PeerCertificates[0]), cs.DidResume
	// 'C' announces an RPC connection (cluster/transport.go).
	if _, err := conn.Write([]byte{'C'}); err != nil {
		return serial, st, resumed, fmt.Errorf("write: %w", err)
	}
	rc := rpc.NewClient(conn)
	defer rc.Close()
	if err := rc.Call("Cluster.Stats", cluster.StatsArgs{}, &st); err != nil {
		return serial, st, resumed, fmt.Errorf("stats: %w", err)
	}
	return serial, st, resumed, nil
}

// appliedEverywhere waits until every node has applied an entry committed
// after this call: Raft keeps replicating to all of them.
func appliedEverywhere(t *testing.T, c *testcluster.Cluster, what string) {
	t.Helper()
	l := c.WaitLeader(15 * time.Second)
	target := c.Nodes[l].Server.Node().FSM().Applied()
	testutil.WaitFor(t, 30*time.Second, "every node to apply entries committed "+what, func() bool {
		for _, n := range c.Nodes {
			if n.Server.Node().FSM().Applied() <= target {
				return false
			}
		}
		return true
	})
}

// Certificates are rotated under load without a restart and without a
// failed request: first every node's certificate and the clients' for new
// ones of the same CA, then the whole cluster to a new CA, in the order
// that keeps every pair of parties trusting each other (trust both CAs,
// switch the certificates, drop the old CA). Each node is reloaded in
// turn, the bundle file replaced as an operator does, and checked to
// present its new certificate on the API and on the cluster port; Raft
// keeps replicating to every node, followers keep forwarding writes.
// Afterwards the old CA's certificates are refused (a peer's also when it
// resumes a TLS session it was given before the drop), and the cluster
// re-forms its peer connections with the new certificates alone.
func TestCertificateRotationUnderLoad(t *testing.T) {
	// Every failed request counts, so the leader must not be lost to a
	// starved machine (the race detector on two cores): Raft runs with
	// twice the default timeouts instead of the tests' usual 200ms.
	c := testcluster.Start(t, 3, testcluster.Configure(func(cfg *config.Server) {
		cfg.HeartbeatTimeout, cfg.ElectionTimeout = time.Second, time.Second
	}))
	var urls []string
	for i := range c.Nodes {
		urls = append(urls, c.URL(i))
	}
	oldCA := c.CA()
	load := startRotationLoad(t, urls, 2*len(urls), testutil.ClientBundleOf(t, oldCA), "first client certificate")
	load.progress(t, 20, "before any rotation")

	// Same CA: new server certificates, one node at a time, and new client
	// certificates half way through.
	for i, n := range c.Nodes {
		b := testutil.Issue(t, oldCA, auth.RoleServer, auth.IssueOptions{Name: n.Name + " rotated", Hosts: nodeHosts(n)})
		rotate(t, c, i, b)
		load.progress(t, 10, "after "+n.Name+"'s new certificate of the same CA")
		if i == 1 {
			g := load.use(t, "second client certificate", testutil.ClientBundleOf(t, oldCA))
			load.waitGeneration(t, g, 30)
		}
	}
	appliedEverywhere(t, c, "after the rotation within the CA")

	// A new CA, with a gossip key of its own. The bridge bundles
	// (auth.Bundle.Extend) trust both CAs and read both gossip keys.
	newCA, err := auth.NewCA(auth.IssueOptions{Name: "raftlockd rotated test CA"})
	if err != nil {
		t.Fatal(err)
	}
	oldClient := testutil.ClientBundleOf(t, oldCA)
	// 1. Every node and client trusts both CAs; nodes read the new gossip
	// key and still send with the old one.
	for i, n := range c.Nodes {
		cur, err := auth.LoadBundle(n.Config.Bundle)
		if err != nil {
			t.Fatal(err)
		}
		rotate(t, c, i, cur.Extend(newCA))
		load.progress(t, 10, "after "+n.Name+" trusts both CAs")
	}
	load.waitGeneration(t, load.use(t, "old-CA client trusting both CAs", withCAs(oldClient, nil, oldCA.Cert, newCA.Cert)), 30)
	// 2. Every node and client switches to a certificate of the new CA;
	// nodes send with the new gossip key and still read the old one.
	newServers := make([]*auth.Bundle, len(c.Nodes))
	for i, n := range c.Nodes {
		b := testutil.Issue(t, newCA, auth.RoleServer, auth.IssueOptions{Name: n.Name + " of the new CA", Hosts: nodeHosts(n)})
		newServers[i] = b
		rotate(t, c, i, b.Extend(oldCA))
		load.progress(t, 10, "after "+n.Name+"'s certificate of the new CA")
		if i == 0 {
			g := load.use(t, "new-CA client trusting both CAs", withCAs(testutil.ClientBundleOf(t, newCA), nil, newCA.Cert, oldCA.Cert))
			load.waitGeneration(t, g, 30)
		}
	}
	// A server certificate of the old CA is still good on the cluster
	// port; a peer holding one keeps the TLS sessions it is given.
	oldServer := testutil.Issue(t, oldCA, auth.RoleServer, auth.IssueOptions{Name: "old-CA peer", Hosts: []string{"127.0.0.1"}})
	oldPeer := auth.NewStaticSource(withCAs(oldServer, nil, oldCA.Cert, newCA.Cert)).PeerClientConfig()
	oldPeer.ClientSessionCache = tls.NewLRUClientSessionCache(len(c.Nodes))
	for _, n := range c.Nodes {
		if _, _, _, err := peerStats(n.Server.Node().RaftAddr(), oldPeer); err != nil {
			t.Fatalf("%s: a peer with a server certificate of the old CA before it is dropped: %v", n.Name, err)
		}
	}
	// 3. Every node and client drops the old CA and its gossip key.
	for i, n := range c.Nodes {
		rotate(t, c, i, newServers[i])
		load.progress(t, 10, "after "+n.Name+" dropped the old CA")
	}
	final := load.use(t, "new-CA client trusting the new CA", withCAs(testutil.ClientBundleOf(t, newCA), nil, newCA.Cert))
	load.waitGeneration(t, final, 30)
	afterLast := load.total()
	load.progress(t, 20, "after the last rotation")
	appliedEverywhere(t, c, "after the rotation to the new CA")
	load.halt()
	load.failures(t)
	t.Logf("%d requests, none failed, %d of them after the last rotation, in %s", load.total(), load.total()-afterLast,
		time.Since(load.start).Round(time.Millisecond))

	// The old CA no longer counts anywhere: its client certificate is
	// refused by the API, its server certificate by the cluster port, also
	// when the peer resumes a TLS session it was given before the drop.
	for i, n := range c.Nodes {
		cl := bundleClient(t, urls[i], withCAs(oldClient, nil, newCA.Cert), 0)
		if _, err := cl.Describe(context.Background(), "", "rotation-0-0"); !errors.Is(err, errcode.CertificateUntrusted) {
			t.Errorf("%s: a client certificate of the old CA: %v, want %s", n.Name, err, errcode.CertificateUntrusted.Code)
		}
		if _, _, resumed, err := peerStats(n.Server.Node().RaftAddr(), oldPeer); err == nil {
			t.Errorf("%s: the cluster port served a peer with a server certificate of the old CA (session resumed: %v)", n.Name, resumed)
		}
		fresh := auth.NewStaticSource(withCAs(oldServer, nil, newCA.Cert)).PeerClientConfig()
		if _, _, _, err := peerStats(n.Server.Node().RaftAddr(), fresh); err == nil {
			t.Errorf("%s: the cluster port served a peer with a server certificate of the old CA", n.Name)
		}
		for _, m := range n.Server.Node().Members() {
			if m.Status != "alive" {
				t.Errorf("%s's gossip sees %s as %s", n.Name, m.ID, m.Status)
			}
		}
	}

	// The cluster's own connections were opened before the rotation and
	// are still in use. Cutting the leader off closes its connections: the
	// others elect a leader over connections they open now, which then
	// brings the old leader back over new ones too, all made with the new
	// certificates and the new CA only.
	old := c.WaitLeader(15 * time.Second)
	var others []int
	for i := range c.Nodes {
		if i != old {
			others = append(others, i)
		}
	}
	c.Partition([]int{old}, others)
	testutil.WaitFor(t, 30*time.Second, "a leader among the nodes cut off from the old one", func() bool {
		for _, i := range others {
			if c.Nodes[i].Server.Node().IsLeader() {
				return true
			}
		}
		return false
	})
	c.Heal()
	ctx := context.Background()
	newClient := testutil.ClientBundleOf(t, newCA)
	for i, n := range c.Nodes {
		cl := bundleClient(t, urls[i], newClient, 20*time.Second)
		lease, err := cl.Acquire(ctx, wire.AcquireRequest{Key: "after-reconnect-" + n.Name, Owner: "o", TTLSeconds: 30})
		if err != nil {
			t.Fatalf("acquire on %s after the cluster reconnected: %v", n.Name, err)
		}
		if _, err := cl.Release(ctx, lease.Ref(), false); err != nil {
			t.Fatalf("release on %s after the cluster reconnected: %v", n.Name, err)
		}
	}
	c.WaitConverged(30 * time.Second)
}

// A reload refuses a bundle bound to another node, as the start does, and
// keeps the one in use: presenting another node's certificate would shut
// the node out of its cluster's Raft. A bundle bound to the node itself
// is taken.
func TestAReloadRefusesABundleOfAnotherNode(t *testing.T) {
	cfg := testutil.Config(t, t.TempDir())
	cfg.NodeID = "n1"
	srv := testutil.StartServer(t, cfg)
	before := apiSerial(t, srv.Addr(), testutil.CA(t).Roots())
	bundle := func(node string) *auth.Bundle {
		return testutil.Issue(t, nil, auth.RoleServer, auth.IssueOptions{Name: node,
			Hosts: []string{"127.0.0.1", "::1", "localhost"}, Node: node})
	}
	if err := bundle("n2").WriteFile(cfg.Bundle); err != nil {
		t.Fatal(err)
	}
	if err := srv.Reload(); err == nil || !strings.Contains(err.Error(), `node "n2"`) {
		t.Fatalf("node n1 reloaded a bundle bound to node n2: %v", err)
	}
	if got := apiSerial(t, srv.Addr(), testutil.CA(t).Roots()); got != before {
		t.Fatalf("after a refused reload the API presents %s, want %s", got, before)
	}
	own := bundle("n1")
	if err := own.WriteFile(cfg.Bundle); err != nil {
		t.Fatal(err)
	}
	if err := srv.Reload(); err != nil {
		t.Fatalf("reload of n1's own bundle: %v", err)
	}
	if got := apiSerial(t, srv.Addr(), testutil.CA(t).Roots()); got != auth.SerialOf(own.Cert) {
		t.Fatalf("after the reload the API presents %s, want %s", got, auth.SerialOf(own.Cert))
	}
}

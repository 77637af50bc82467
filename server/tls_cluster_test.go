package server_test

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/memberlist"
	"github.com/rs/xid"

	"github.com/raftlockd/raftlockd/auth"
	"github.com/raftlockd/raftlockd/client"
	"github.com/raftlockd/raftlockd/config"
	"github.com/raftlockd/raftlockd/internal/testutil"
	"github.com/raftlockd/raftlockd/server"
	"github.com/raftlockd/raftlockd/wire"
)

// tlsCluster is a cluster of whole nodes whose API, Raft, forwarding and
// gossip all run over TLS with bundles of the shared test CA.
type tlsCluster struct {
	t     *testing.T
	nodes []*tlsNode
}

type tlsNode struct {
	cfg config.Server
	srv *server.Server // nil once stopped
}

// tlsNodeConfig is the configuration of one cluster node named name, with a
// server bundle of the shared CA.
func tlsNodeConfig(t *testing.T, name string) config.Server {
	cfg := testutil.Config(t, t.TempDir())
	cfg.NodeID = name
	cfg.Listen, cfg.RaftListen, cfg.GossipListen = testutil.FreeAddr(t), testutil.FreeAddr(t), testutil.FreeAddr(t)
	cfg.Bundle = testutil.ServerBundle(t, cfg.DataDir, nil, hostOf(cfg.Listen))
	cfg.DeadServerTimeout = 30 * time.Second
	cfg.LeaderWait = 2 * time.Second
	return cfg
}

func hostOf(addr string) string {
	h, _, _ := net.SplitHostPort(addr)
	return h
}

func startTLSNode(t *testing.T, cfg config.Server) *server.Server {
	t.Helper()
	srv, err := server.Start(cfg, testutil.Logger(t))
	if err != nil {
		t.Fatalf("start %s: %v", cfg.NodeID, err)
	}
	t.Cleanup(func() { stopServer(srv) })
	return srv
}

func stopServer(srv *server.Server) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_ = srv.Close(ctx)
}

// startTLSCluster starts size nodes that bootstrap one cluster, and waits
// until all are voters under one leader.
func startTLSCluster(t *testing.T, size int) *tlsCluster {
	t.Helper()
	c := &tlsCluster{t: t}
	var gossip []string
	for i := range size {
		cfg := tlsNodeConfig(t, fmt.Sprintf("n%d", i+1))
		cfg.BootstrapExpect = size
		gossip = append(gossip, cfg.GossipListen)
		c.nodes = append(c.nodes, &tlsNode{cfg: cfg})
	}
	for _, n := range c.nodes {
		n.cfg.Join = gossip
		n.srv = startTLSNode(t, n.cfg)
	}
	testutil.WaitFor(t, 30*time.Second, "all nodes to be voters under one leader", func() bool {
		l := c.leader()
		if l < 0 {
			return false
		}
		servers, err := c.nodes[l].srv.Node().Servers()
		if err != nil || len(servers) != size {
			return false
		}
		for _, n := range c.nodes {
			if n.srv.Node().FSM().BackendHash() == "" {
				return false
			}
		}
		return true
	})
	return c
}

// leader is the index of a running node that leads, or -1.
func (c *tlsCluster) leader() int {
	for i, n := range c.nodes {
		if n.srv != nil && n.srv.Node().IsLeader() {
			return i
		}
	}
	return -1
}

func (c *tlsCluster) waitLeader() int {
	c.t.Helper()
	l := -1
	testutil.WaitFor(c.t, 15*time.Second, "a leader", func() bool { l = c.leader(); return l >= 0 })
	return l
}

// follower is the index of a running node that does not lead.
func (c *tlsCluster) follower() int {
	for i, n := range c.nodes {
		if n.srv != nil && !n.srv.Node().IsLeader() {
			return i
		}
	}
	c.t.Fatal("no follower")
	return -1
}

func (c *tlsCluster) stop(i int) {
	stopServer(c.nodes[i].srv)
	c.nodes[i].srv = nil
}

func (c *tlsCluster) gossipAddrs() []string {
	var out []string
	for _, n := range c.nodes {
		out = append(out, n.cfg.GossipListen)
	}
	return out
}

// inRaft reports whether any running node's Raft configuration holds id.
func (c *tlsCluster) inRaft(id string) bool {
	for _, n := range c.nodes {
		if n.srv == nil {
			continue
		}
		servers, err := n.srv.Node().Servers()
		if err != nil {
			continue
		}
		for _, s := range servers {
			if string(s.ID) == id {
				return true
			}
		}
	}
	return false
}

// inGossip reports whether any running node's gossip knows id as alive.
func (c *tlsCluster) inGossip(id string) bool {
	for _, n := range c.nodes {
		if n.srv == nil {
			continue
		}
		for _, m := range n.srv.Node().Members() {
			if m.ID == id && m.Status == "alive" {
				return true
			}
		}
	}
	return false
}

// neverWithin checks cond for the whole of d and fails the test if it ever
// holds: how long an absence must last to count.
func neverWithin(t *testing.T, d time.Duration, what string, cond func() bool) {
	t.Helper()
	for end := time.Now().Add(d); time.Now().Before(end); time.Sleep(50 * time.Millisecond) {
		if cond() {
			t.Fatalf("%s", what)
		}
	}
}

// membersOverAPI lists the ids /v1/cluster/members of node i reports.
func (c *tlsCluster) membersOverAPI(i int) []string {
	c.t.Helper()
	adm := operatorClient(c.t, c.nodes[i].srv.URL())
	m, err := adm.ClusterMembers(context.Background())
	if err != nil {
		c.t.Fatalf("cluster members: %v", err)
	}
	var ids []string
	for _, x := range m.Members {
		ids = append(ids, x.ID)
	}
	return ids
}

// operatorClient calls url with a server certificate of the shared CA.
func operatorClient(t *testing.T, url string) *client.Client {
	t.Helper()
	b := testutil.Issue(t, nil, auth.RoleServer, auth.IssueOptions{Name: "operator"})
	hc := certClient(t, b)
	c, err := client.New(url, client.WithHTTPClient(hc), client.WithRetry(0))
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// sdkClient is an SDK client of the shared CA allowed every namespace; its idle
// connections are closed when the test ends.
func sdkClient(t *testing.T, url string, b *auth.Bundle, opts ...client.Option) *client.Client {
	t.Helper()
	if b == nil {
		b = testutil.ClientBundle(t)
	}
	c, err := client.New(url, append([]client.Option{client.WithHTTPClient(certClient(t, b))}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// rawPeer opens a connection to a node's Raft port and says it carries
// Raft, optionally over TLS with cfg. It reports how the node answered:
// nil when it kept the connection open and silent for a while (a Raft
// stream waiting for a request), else the error the read ended with.
func rawPeer(t *testing.T, addr string, cfg *tls.Config) (answered []byte, err error) {
	t.Helper()
	conn, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		t.Fatalf("dial %s: %v", addr, err)
	}
	defer conn.Close()
	var c net.Conn = conn
	if cfg != nil {
		tc := tls.Client(conn, cfg)
		_ = tc.SetDeadline(time.Now().Add(5 * time.Second))
		if err := tc.Handshake(); err != nil {
			return nil, err
		}
		c = tc
	}
	// 'R' announces a Raft stream (cluster/transport.go); what follows is
	// an AppendEntries request type byte and the start of its body. Sent
	// in plain text it is padded to more than a TLS record header, so that
	// a node expecting TLS has a whole header to reject.
	hello := []byte{'R', 0, 0x81, 0xa4}
	if cfg == nil {
		hello = append(hello, 'T', 'e', 'r', 'm', 1, 2, 3, 4)
	}
	if _, err := c.Write(hello); err != nil {
		return nil, err
	}
	_ = c.SetReadDeadline(time.Now().Add(500 * time.Millisecond))
	buf := make([]byte, 512)
	n, err := c.Read(buf)
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() && n == 0 {
		return nil, nil
	}
	if err == nil {
		err = errors.New("the node answered")
	}
	return buf[:n], err
}

// postRetrying posts body to url as a lockd client does: a 503 that says
// when to retry (a node between leaders, a forward that timed out on a busy
// machine) is sent again after that time, for up to 15 s. Any other answer
// is returned with its body read.
func postRetrying(t *testing.T, hc *http.Client, url, body string) (*http.Response, []byte) {
	t.Helper()
	deadline := time.Now().Add(15 * time.Second)
	for {
		resp, err := hc.Post(url, "application/json", strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		got, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		after, _ := strconv.Atoi(resp.Header.Get("Retry-After"))
		if resp.StatusCode != http.StatusServiceUnavailable || after <= 0 || time.Now().After(deadline) {
			return resp, got
		}
		t.Logf("POST %s: 503 %s; retrying in %d s", url, got, after)
		time.Sleep(time.Duration(after) * time.Second)
	}
}

// A cluster whose nodes talk only TLS: writes on a follower are forwarded
// to the leader, coordinator requests too, the leader fails over, and the
// Raft port does not speak to anyone without a server certificate of the
// cluster's CA.
func TestClusterTalksOnlyTLS(t *testing.T) {
	c := startTLSCluster(t, 3)
	ctx := context.Background()
	l, f := c.leader(), c.follower()
	leaderURL, followerURL := c.nodes[l].srv.URL(), c.nodes[f].srv.URL()
	if !strings.HasPrefix(followerURL, "https://") {
		t.Fatalf("the API is served at %s", followerURL)
	}

	// A write on a follower is forwarded to the leader over the cluster's
	// TLS channel.
	hc := certClient(t, testutil.ClientBundle(t))
	resp, _ := postRetrying(t, hc, followerURL+"/v1/acquire", `{"key":"fwd","owner":"a","ttl_seconds":60}`)
	if resp.StatusCode != http.StatusOK || resp.Header.Get(wire.HeaderServedBy) != c.nodes[f].cfg.NodeID {
		t.Fatalf("acquire on follower %s: %d, served by %q", c.nodes[f].cfg.NodeID, resp.StatusCode, resp.Header.Get(wire.HeaderServedBy))
	}
	if d, err := sdkClient(t, leaderURL, nil).Describe(ctx, "", "fwd"); err != nil || d.Owner != "a" {
		t.Fatalf("the leader does not see the forwarded acquire: %+v %v", d, err)
	}

	// A coordinator request on a follower is handed to the leader's API
	// over HTTPS, the follower presenting its server certificate.
	tcc := certClient(t, testutil.Issue(t, nil, auth.RoleTCClient, auth.IssueOptions{}))
	resp, body := postRetrying(t, tcc, followerURL+"/v1/txn/decide", `{"txn_id":"`+xid.New().String()+`","state":"rollback"}`)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("decide on a follower: %d %s", resp.StatusCode, body)
	}

	// The Raft port, seen from a socket.
	raftAddr := c.nodes[f].srv.Node().RaftAddr()
	sameCA := testutil.Issue(t, nil, auth.RoleServer, auth.IssueOptions{Name: "peer"})
	peerCfg := auth.NewStaticSource(sameCA).PeerClientConfig()
	if _, err := rawPeer(t, raftAddr, peerCfg); err != nil {
		t.Fatalf("a peer with a server certificate of the CA was refused: %v", err)
	}
	if got, err := rawPeer(t, raftAddr, nil); len(got) > 0 && got[0] != 0x15 {
		// Only a TLS alert record (0x15), silence or a closed connection
		// may come back.
		t.Fatalf("plaintext Raft was served: answer %q, %v", got, err)
	}
	otherCA, err := auth.NewCA(auth.IssueOptions{Name: "other"})
	if err != nil {
		t.Fatal(err)
	}
	for name, b := range map[string]*auth.Bundle{
		"server of another CA": testutil.Issue(t, otherCA, auth.RoleServer, auth.IssueOptions{Name: "intruder"}),
		"client of the CA":     testutil.ClientBundle(t),
		"tcclient of the CA":   testutil.Issue(t, nil, auth.RoleTCClient, auth.IssueOptions{}),
	} {
		cfg := &tls.Config{InsecureSkipVerify: true, Certificates: []tls.Certificate{b.TLSCertificate()}} //nolint:gosec // the test is about the server's check
		if _, err := rawPeer(t, raftAddr, cfg); err == nil {
			t.Errorf("%s: the Raft port accepted the connection", name)
		}
	}
	if _, err := rawPeer(t, raftAddr, &tls.Config{InsecureSkipVerify: true}); err == nil { //nolint:gosec // as above
		t.Error("without a certificate: the Raft port accepted the connection")
	}

	// Gossip is encrypted: a memberlist node without the key, or with
	// another one, does not get in.
	key := testutil.CA(t).GossipKey
	otherKey := otherCA.GossipKey
	for name, k := range map[string][]byte{"no key": nil, "another key": otherKey} {
		id := "stranger-" + strings.ReplaceAll(name, " ", "-")
		ml := strangerGossip(t, id, k)
		if _, err := ml.Join(c.gossipAddrs()); err == nil {
			t.Errorf("%s: joined the cluster's gossip", name)
		}
		neverWithin(t, 2*time.Second, name+": the stranger became a member", func() bool {
			return c.inGossip(id) || ml.NumMembers() > 1
		})
		if slices.Contains(c.membersOverAPI(l), id) {
			t.Errorf("%s: /v1/cluster/members lists the stranger", name)
		}
		_ = ml.Shutdown()
	}
	// The same stranger with the key gets in: the refusals above are the
	// encryption's doing.
	ml := strangerGossip(t, "stranger-with-key", key)
	if _, err := ml.Join(c.gossipAddrs()); err != nil {
		t.Fatalf("with the key: %v", err)
	}
	testutil.WaitFor(t, 5*time.Second, "the stranger with the key in gossip", func() bool { return c.inGossip("stranger-with-key") })
	_ = ml.Shutdown()

	// Leader failover over TLS.
	c.stop(l)
	nl := c.waitLeader()
	cl := sdkClient(t, c.nodes[nl].srv.URL(), nil, client.WithRetry(15*time.Second))
	if d, err := cl.Describe(ctx, "", "fwd"); err != nil || d.Owner != "a" {
		t.Fatalf("after failover: %+v %v", d, err)
	}
	other := c.follower()
	lease, err := sdkClient(t, c.nodes[other].srv.URL(), nil, client.WithRetry(15*time.Second)).
		Acquire(ctx, wire.AcquireRequest{Key: "after-failover", Owner: "b", TTLSeconds: 60})
	if err != nil {
		t.Fatalf("acquire after failover: %v", err)
	}
	if _, err := cl.Release(ctx, lease.Ref(), false); err != nil {
		t.Fatalf("release after failover: %v", err)
	}
}

// metaDelegate publishes a member's metadata as raftlockd nodes do, so
// that a stranger that got in would be listed.
type metaDelegate struct{ meta []byte }

func (d metaDelegate) NodeMeta(int) []byte                  { return d.meta }
func (metaDelegate) NotifyMsg([]byte)                       {}
func (metaDelegate) GetBroadcasts(int, int) [][]byte        { return nil }
func (metaDelegate) LocalState(bool) []byte                 { return nil }
func (metaDelegate) MergeRemoteState(buf []byte, join bool) {}

// strangerGossip is a bare memberlist node on loopback, labelled as the
// cluster's, encrypting with key (nil: not at all).
func strangerGossip(t *testing.T, id string, key []byte) *memberlist.Memberlist {
	t.Helper()
	mc := memberlist.DefaultLANConfig()
	mc.Name = id
	mc.BindAddr, mc.BindPort = "127.0.0.1", 0
	mc.Label = "raftlockd"
	mc.LogOutput = io.Discard
	mc.TCPTimeout = time.Second
	mc.ProbeInterval, mc.ProbeTimeout, mc.GossipInterval = 200*time.Millisecond, 100*time.Millisecond, 50*time.Millisecond
	if key != nil {
		mc.SecretKey = key
	}
	meta, _ := json.Marshal(map[string]any{"id": id, "raft": "127.0.0.1:1", "expect": 0, "state": false})
	mc.Delegate = metaDelegate{meta: meta}
	ml, err := memberlist.Create(mc)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = ml.Shutdown() })
	return ml
}

// A node of another CA cannot join: (a) with its own CA's gossip key it
// does not even get into gossip; (b) with the cluster's gossip key it gets
// into gossip, but the leader does not add it to Raft (it cannot answer
// over the cluster's mutual TLS) and its connections are refused.
func TestForeignNodeIsRejected(t *testing.T) {
	c := startTLSCluster(t, 3)
	ctx := context.Background()
	foreignCA, err := auth.NewCA(auth.IssueOptions{Name: "foreign CA"})
	if err != nil {
		t.Fatal(err)
	}
	foreignNode := func(name string, gossipKey []byte) config.Server {
		cfg := tlsNodeConfig(t, name)
		b := testutil.Issue(t, foreignCA, auth.RoleServer, auth.IssueOptions{Name: name,
			Hosts: []string{"127.0.0.1", "localhost", hostOf(cfg.Listen)}})
		b.GossipKey = gossipKey
		cfg.Bundle = filepath.Join(cfg.DataDir, "foreign.pem")
		if err := b.WriteFile(cfg.Bundle); err != nil {
			t.Fatal(err)
		}
		cfg.Join = c.gossipAddrs()
		return cfg
	}
	writes := sdkClient(t, c.nodes[c.waitLeader()].srv.URL(), nil, client.WithRetry(10*time.Second))
	write := func(key string) {
		t.Helper()
		l, err := writes.Acquire(ctx, wire.AcquireRequest{Key: key, Owner: "o", TTLSeconds: 30})
		if err != nil {
			t.Fatalf("the cluster stopped serving writes: %v", err)
		}
		if _, err := writes.Release(ctx, l.Ref(), false); err != nil {
			t.Fatalf("the cluster stopped serving writes: %v", err)
		}
	}

	t.Run("another CA and its gossip key", func(t *testing.T) {
		startTLSNode(t, foreignNode("foreign-a", foreignCA.GossipKey))
		neverWithin(t, 3*time.Second, "the foreign node got into the cluster", func() bool {
			return c.inGossip("foreign-a") || c.inRaft("foreign-a")
		})
		if slices.Contains(c.membersOverAPI(c.waitLeader()), "foreign-a") {
			t.Fatal("/v1/cluster/members lists the foreign node")
		}
		write("after-a")
	})

	t.Run("another CA with the cluster's gossip key", func(t *testing.T) {
		srv := startTLSNode(t, foreignNode("foreign-b", testutil.CA(t).GossipKey))
		testutil.WaitFor(t, 10*time.Second, "the foreign node in gossip", func() bool { return c.inGossip("foreign-b") })
		if !slices.Contains(c.membersOverAPI(c.waitLeader()), "foreign-b") {
			t.Fatal("/v1/cluster/members does not list the gossip member")
		}
		// The leader reconciles every second: give it several rounds.
		neverWithin(t, 4*time.Second, "the leader added the foreign node to the Raft configuration", func() bool {
			return c.inRaft("foreign-b")
		})
		// Neither end accepts the other's connections.
		l := c.waitLeader()
		pctx, cancel := context.WithTimeout(ctx, 3*time.Second)
		defer cancel()
		if _, err := c.nodes[l].srv.Node().PeerStatus(pctx, srv.Node().RaftAddr()); err == nil {
			t.Fatal("the leader reached the foreign node over the cluster channel")
		}
		if _, err := srv.Node().PeerStatus(pctx, c.nodes[l].srv.Node().RaftAddr()); err == nil {
			t.Fatal("the foreign node reached the leader over the cluster channel")
		}
		if srv.Node().HasLeader() {
			t.Fatal("the foreign node follows the cluster's leader")
		}
		write("after-b")
	})
}

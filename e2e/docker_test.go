// Package e2e holds tests of raftlockd as it is deployed: the container
// image built from deploy/Dockerfile and the three-node cluster of
// deploy/docker-compose.yml, on this machine's Docker engine. They build
// the static binary and the image (under a unique tag), start the cluster
// under a unique compose project on localhost ports of their own, talk to
// it over mutual TLS with the bundles its certs service created, break the
// leader's container and tear everything down (`down -v`, `rmi`) whatever
// happens. They skip only when no Docker engine answers.
package e2e

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/tls"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/raftlockd/raftlockd/auth"
	"github.com/raftlockd/raftlockd/client"
	"github.com/raftlockd/raftlockd/errcode"
	"github.com/raftlockd/raftlockd/internal/workload"
	"github.com/raftlockd/raftlockd/wire"
)

// scenarioBudget bounds everything after the image is built: bringing the
// cluster up, both fault cases and the checks.
const scenarioBudget = 4 * time.Minute

func repoRoot(t *testing.T) string {
	t.Helper()
	_, file, _, _ := runtime.Caller(0)
	return filepath.Join(filepath.Dir(file), "..")
}

// requireDocker skips the test, saying why, unless a Docker engine answers.
func requireDocker(t *testing.T) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, "docker", "info", "--format", "{{.ServerVersion}}").CombinedOutput()
	if err != nil {
		msg := fmt.Sprintf("SKIPPED: Docker tests need a Docker engine and none answers (`docker info`: %v: %s)",
			err, strings.TrimSpace(string(out)))
		fmt.Fprintln(os.Stderr, msg)
		t.Skip(msg)
	}
	t.Logf("Docker engine %s", strings.TrimSpace(string(out)))
}

// composeCommand finds Compose: the docker plugin, else docker-compose.
func composeCommand(t *testing.T) []string {
	t.Helper()
	if out, err := exec.Command("docker", "compose", "version").Output(); err == nil {
		t.Logf("using docker compose: %s", lastLine(string(out)))
		return []string{"docker", "compose"}
	}
	if path, err := exec.LookPath("docker-compose"); err == nil {
		out, _ := exec.Command(path, "version", "--short").Output()
		t.Logf("using %s %s", path, strings.TrimSpace(string(out)))
		return []string{path}
	}
	t.Fatal("a Docker engine answers but neither `docker compose` nor `docker-compose` is installed " +
		"(.ci/run installs docker-compose; by hand: apt-get install docker-compose)")
	return nil
}

// run executes a command and returns its combined output.
func run(ctx context.Context, env []string, name string, args ...string) (string, error) {
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Env = append(os.Environ(), env...)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	err := cmd.Run()
	if err != nil {
		return out.String(), fmt.Errorf("%s %s: %w\n%s", name, strings.Join(args, " "), err, out.String())
	}
	return out.String(), nil
}

// mustRun is run that fails the test on an error.
func mustRun(t *testing.T, ctx context.Context, env []string, name string, args ...string) string {
	t.Helper()
	out, err := run(ctx, env, name, args...)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

func randomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

func freePort(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	_, port, _ := net.SplitHostPort(ln.Addr().String())
	return port
}

// buildImage builds the static binary and the image from deploy/Dockerfile
// in a context of its own (the working tree's deploy/ is left alone) and
// removes the image when the test ends. It returns the image and the
// binary, which also serves as the operator's CLI on this host.
func buildImage(t *testing.T) (image, bin string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	root, dir := repoRoot(t), t.TempDir()
	start := time.Now()
	cmd := exec.CommandContext(ctx, "go", "build", "-trimpath", "-ldflags", "-s -w", "-o", filepath.Join(dir, "raftlockd"),
		"./cmd/raftlockd")
	cmd.Dir, cmd.Env = root, append(os.Environ(), "CGO_ENABLED=0")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("static build: %v\n%s", err, out)
	}
	for _, f := range []string{"Dockerfile", ".dockerignore"} {
		raw, err := os.ReadFile(filepath.Join(root, "deploy", f))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, f), raw, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Mkdir(filepath.Join(dir, "data"), 0o755); err != nil {
		t.Fatal(err)
	}
	image = "raftlockd:e2e-" + randomHex(4)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		if _, err := run(ctx, nil, "docker", "rmi", "-f", image); err != nil {
			t.Logf("removing the image: %v", err)
		}
	})
	mustRun(t, ctx, nil, "docker", "build", "-q", "-t", image, dir)
	t.Logf("built %s in %s", image, time.Since(start).Round(time.Millisecond))
	return image, filepath.Join(dir, "raftlockd")
}

// composeCluster is deploy/docker-compose.yml running under its own
// project name.
type composeCluster struct {
	t         *testing.T
	ctx       context.Context // carries tlsConfig for the workload's calls
	compose   []string
	env       []string
	endpoints []string // published API of node1..node3 (https)
	bin       string   // the raftlockd binary, for the CLI on this host
	ids       []string // container ids, by node, once known

	// Bundles copied out of the certs service's volume: client.pem, and a
	// node's server bundle for the operator commands (snapshots).
	clientBundle, serverBundle string
	tlsConfig                  *tls.Config // client.pem's: its certificate, the cluster's CA
}

// run runs a compose command on the project and fails the test on an error.
func (c *composeCluster) run(args ...string) string {
	c.t.Helper()
	full := append(append([]string{}, c.compose[1:]...), args...)
	return mustRun(c.t, c.ctx, c.env, c.compose[0], full...)
}

func (c *composeCluster) service(i int) string { return fmt.Sprintf("node%d", i+1) }

// container returns the id of node i's container. Stopping, starting and
// restarting keep a container, so each id is asked of Compose once.
func (c *composeCluster) container(i int) string {
	c.t.Helper()
	if id := c.ids[i]; id != "" {
		return id
	}
	id := strings.TrimSpace(c.run("ps", "-q", c.service(i)))
	if id == "" {
		c.t.Fatalf("no container for %s", c.service(i))
	}
	c.ids[i] = id
	return id
}

func (c *composeCluster) inspect(i int, format string) string {
	c.t.Helper()
	return strings.TrimSpace(mustRun(c.t, c.ctx, nil, "docker", "inspect", "-f", format, c.container(i)))
}

// waitHealthy waits until Docker reports node i's health check healthy.
func (c *composeCluster) waitHealthy(i int, timeout time.Duration) {
	c.t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		status := c.inspect(i, "{{.State.Health.Status}}")
		if status == "healthy" {
			return
		}
		if time.Now().After(deadline) {
			c.t.Fatalf("%s is %q after %s; last health checks:\n%s", c.service(i), status, timeout,
				c.inspect(i, "{{range .State.Health.Log}}{{.ExitCode}} {{.Output}}{{end}}"))
		}
		time.Sleep(250 * time.Millisecond)
	}
}

func (c *composeCluster) others(i int) []string {
	var out []string
	for j, ep := range c.endpoints {
		if j != i {
			out = append(out, ep)
		}
	}
	return out
}

func startCompose(t *testing.T, image string) *composeCluster {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), scenarioBudget)
	t.Cleanup(cancel)
	c := &composeCluster{t: t, ctx: ctx, compose: composeCommand(t), ids: make([]string, 3)}
	project := "rle2e" + randomHex(4)
	c.compose = append(c.compose, "-p", project, "-f", filepath.Join(repoRoot(t), "deploy", "docker-compose.yml"))
	c.env = []string{"RAFTLOCKD_IMAGE=" + image, "RAFTLOCKD_PUBLISH_HOST=127.0.0.1"}
	for i := 1; i <= 3; i++ {
		port := freePort(t)
		c.env = append(c.env, fmt.Sprintf("RAFTLOCKD_NODE%d_PORT=%s", i, port))
		c.endpoints = append(c.endpoints, "https://127.0.0.1:"+port)
	}
	t.Cleanup(func() {
		// A fresh context: the scenario's may have run out.
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		args := append(append([]string{}, c.compose[1:]...), "logs", "--no-color")
		if t.Failed() {
			logs, _ := run(ctx, c.env, c.compose[0], args...)
			t.Logf("compose logs:\n%s", logs)
		}
		args = append(append([]string{}, c.compose[1:]...), "down", "-v", "--remove-orphans", "-t", "5")
		if out, err := run(ctx, c.env, c.compose[0], args...); err != nil {
			t.Errorf("tearing down project %s: %v", project, err)
		} else {
			t.Logf("project %s torn down (containers, network, volumes)\n%s", project, strings.TrimSpace(out))
		}
	})
	start := time.Now()
	c.run("up", "-d")
	for i := range c.endpoints {
		c.waitHealthy(i, 90*time.Second)
	}
	t.Logf("project %s: three nodes healthy %s after `up -d`; API on %v", project, time.Since(start).Round(time.Millisecond),
		c.endpoints)
	// The image has no shell: the health check is the binary itself, and
	// the server runs as the unprivileged user.
	for i := range c.endpoints {
		if user := c.inspect(i, "{{.Config.User}}"); user != "65532:65532" {
			t.Fatalf("%s runs as user %q, want 65532:65532", c.service(i), user)
		}
		if test := c.inspect(i, "{{json .Config.Healthcheck.Test}}"); test != `["CMD","/raftlockd","health"]` {
			t.Fatalf("%s's health check: %s", c.service(i), test)
		}
	}

	// The certificates: what a user copies out of the volume (docker cp
	// reads it through a running node; the image has no shell).
	dir := t.TempDir()
	c.clientBundle, c.serverBundle = filepath.Join(dir, "client.pem"), filepath.Join(dir, "node1.pem")
	ca := c.copyOut("/tls/ca.pem", filepath.Join(dir, "ca.pem"))
	c.copyOut("/tls/client.pem", c.clientBundle)
	c.copyOut("/tls/node1.pem", c.serverBundle)
	b, err := auth.LoadBundle(c.clientBundle)
	if err != nil {
		t.Fatal(err)
	}
	id, err := b.Identity()
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("copied out %s bundle %q (CA %s)", id.Role, id.Name, id.CA)
	c.tlsConfig = auth.ClientConfig(b)
	c.ctx = workload.WithTLS(ctx, c.tlsConfig)

	// `up` again keeps the certificates: the certs service finds its CA
	// and writes nothing; the nodes, unchanged, keep running.
	again := time.Now()
	c.run("up", "-d")
	for i := range c.endpoints {
		c.waitHealthy(i, 90*time.Second)
	}
	if raw := c.copyOut("/tls/ca.pem", filepath.Join(dir, "ca-again.pem")); !bytes.Equal(raw, ca) {
		t.Fatal("`up -d` again replaced the CA")
	}
	certsLog := lastLine(c.run("logs", "--no-color", "certs"))
	if !strings.Contains(certsLog, "exists; nothing written") {
		t.Fatalf("the certs service's last words after `up -d` again: %q", certsLog)
	}
	t.Logf("`up -d` again took %s and kept the CA; certs: %s", time.Since(again).Round(time.Millisecond), certsLog)
	return c
}

// copyOut copies file from node1's container to path on this host and
// returns its content.
func (c *composeCluster) copyOut(file, path string) []byte {
	c.t.Helper()
	mustRun(c.t, c.ctx, nil, "docker", "cp", c.container(0)+":"+file, path)
	raw, err := os.ReadFile(path)
	if err != nil {
		c.t.Fatal(err)
	}
	return raw
}

// client is a client of endpoint presenting client.pem.
func (c *composeCluster) client(endpoint string) *client.Client {
	c.t.Helper()
	cl, err := client.New(endpoint, client.WithTLS(c.tlsConfig))
	if err != nil {
		c.t.Fatal(err)
	}
	return cl
}

func startLoad(t *testing.T, c *composeCluster, prefix string) *workload.Load {
	t.Helper()
	seed := time.Now().UnixNano()
	t.Logf("load %s: seed %d", prefix, seed)
	// Requests outlast the servers' default --leader-wait (5s).
	load, err := workload.Start(workload.Config{Endpoints: c.endpoints, TLS: c.tlsConfig, Writers: 6, Seed: seed, Prefix: prefix,
		TTL: 3 * time.Second, Block: 15 * time.Second, Retry: 2 * time.Second, RequestTimeout: 8 * time.Second,
		CycleTimeout: 30 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { load.Stop() })
	return load
}

// finish stops the load, waits until all nodes applied the same log and
// checks every acknowledged commit on every node.
func finish(t *testing.T, c *composeCluster, load *workload.Load) {
	t.Helper()
	writers := load.Stop()
	t.Log(workload.Summary(writers))
	for _, v := range load.Violations() {
		t.Error(v)
	}
	start := time.Now()
	index, err := workload.WaitConverged(c.ctx, c.endpoints, 60*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	converged := time.Since(start)
	if err := workload.Verify(c.ctx, c.endpoints, writers); err != nil {
		t.Fatalf("after the nodes converged at applied index %d: %v", index, err)
	}
	t.Logf("all three nodes applied index %d (converged in %s) and hold every acknowledged commit (checked in %s)",
		index, converged.Round(time.Millisecond), (time.Since(start) - converged).Round(time.Millisecond))
}

// TestDockerCompose runs the compose cluster, checks that its published
// ports serve no one without a client certificate of the cluster's CA,
// writes through node1's published port over mutual TLS and restores a
// backup through a follower; then, while
// writers commit, it stops the leader's container, kills the next leader's
// container with SIGKILL and cuts the next one off the cluster network:
// the other nodes keep serving every client and no acknowledged commit is
// lost.
func TestDockerCompose(t *testing.T) {
	requireDocker(t)
	image, bin := buildImage(t)
	c := startCompose(t, image)
	c.bin = bin

	// A commit through node1's published port is readable through the others.
	cl := c.client(c.endpoints[0])
	lease, err := cl.Acquire(c.ctx, wire.AcquireRequest{Key: "hello", Owner: "e2e", TTLSeconds: 30})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := lease.Update(c.ctx, []byte(`{"from":"node1"}`), client.Conditions{}); err != nil {
		t.Fatal(err)
	}
	if err := lease.Release(c.ctx, false); err != nil {
		t.Fatal(err)
	}
	for _, ep := range c.endpoints[1:] {
		d, err := c.client(ep).GetPublic(c.ctx, "", "hello")
		if err != nil || string(d.Body) != `{"from":"node1"}` {
			t.Fatalf("read through %s: %q, %v", ep, d.Body, err)
		}
	}

	// The cases share the cluster; each reports to its own subtest.
	for _, tc := range []struct {
		name string
		run  func(*testing.T, *composeCluster)
	}{{"RefuseWithoutCertificate", refuseWithoutCertificate}, {"RestoreThroughFollower", restoreThroughFollower}, {"StopLeader", stopLeader}, {"KillLeader", killLeader},
		{"DisconnectLeader", disconnectLeader}, {"StartOnOthersAddresses", startOnOthersAddresses}, {"DownAndUp", downAndUp}} {
		if !t.Run(tc.name, func(t *testing.T) {
			sub := *c
			sub.t = t
			tc.run(t, &sub)
		}) {
			return
		}
	}
}

func stopLeader(t *testing.T, c *composeCluster) {
	load := startLoad(t, c, "stop")
	if err := load.WaitAcks(30, 30*time.Second); err != nil {
		t.Fatal(err)
	}
	leader, err := workload.WaitLeader(c.ctx, c.endpoints, 20*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	before := load.Acks()
	// What `docker stop` does, without Compose's own start-up time in the
	// measurement: SIGTERM, then wait for the container to exit.
	id := c.container(leader)
	stoppedAt := time.Now()
	mustRun(t, c.ctx, nil, "docker", "kill", "--signal", "TERM", id)
	code := strings.TrimSpace(mustRun(t, c.ctx, nil, "docker", "wait", id))
	stopped := time.Since(stoppedAt)
	// `docker stop` (and Compose) would send SIGKILL after the container's
	// stop timeout (stop_grace_period): a graceful stop ends before it, and
	// exits 0.
	grace, err := time.ParseDuration(c.inspect(leader, "{{.Config.StopTimeout}}") + "s")
	if err != nil {
		t.Fatal(err)
	}
	if code != "0" || stopped >= grace {
		t.Fatalf("%s exited with %s %s after SIGTERM; want 0 within its stop timeout (%s)", c.service(leader), code,
			stopped.Round(time.Millisecond), grace)
	}
	// A leader stopped on purpose hands leadership over first.
	if logs := mustRun(t, c.ctx, nil, "docker", "logs", "--since", stoppedAt.Add(-time.Second).Format(time.RFC3339Nano), id); !strings.Contains(logs, "handed leadership over before stopping") {
		t.Fatalf("%s did not hand leadership over before stopping:\n%s", c.service(leader), logs)
	}
	took, newLeader := c.servedWithout(t, load, leader, stoppedAt, "stop-probe")
	t.Logf("leader %s stopped (SIGTERM to exit: %s); first write through a survivor acknowledged %s after the stop began; "+
		"%s leads; %d commits acknowledged without %s", c.service(leader), stopped.Round(time.Millisecond),
		took.Round(time.Millisecond), c.service(newLeader), load.Acks()-before, c.service(leader))
	checkFailover(t, took)

	// Started again on its volume, the node rejoins by itself.
	startedAt := time.Now()
	mustRun(t, c.ctx, nil, "docker", "start", id)
	c.rejoined(leader, "started again", startedAt)
	finish(t, c, load)
}

func disconnectLeader(t *testing.T, c *composeCluster) {
	load := startLoad(t, c, "disc")
	if err := load.WaitAcks(30, 30*time.Second); err != nil {
		t.Fatal(err)
	}
	leader, err := workload.WaitLeader(c.ctx, c.endpoints, 20*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	id := c.container(leader)
	network := c.inspect(leader, "{{range $k, $v := .NetworkSettings.Networks}}{{$k}} {{end}}")
	if strings.Contains(network, " ") {
		t.Fatalf("%s is on several networks: %q", c.service(leader), network)
	}
	ip := c.inspect(leader, "{{range .NetworkSettings.Networks}}{{.IPAddress}}{{end}}")
	before := load.Acks()
	cutAt := time.Now()
	mustRun(t, c.ctx, nil, "docker", "network", "disconnect", network, id)
	connected := false
	reconnect := func() {
		if !connected {
			connected = true
			mustRun(t, c.ctx, nil, "docker", "network", "connect", "--alias", c.service(leader), network, id)
		}
	}
	defer reconnect()
	took, err := workload.ProbeWrite(c.ctx, c.others(leader)[0], "disc-probe", cutAt, 30*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	// A leader was elected on the other side, so the cut-off node's term
	// as leader has ended. Now it must accept no write: asked from inside
	// its container (the image has no shell; the binary is the client,
	// with the client bundle of the volume), while the load goes on. The client gives up after its own retry
	// budget (10s) on the server's answer, well before --timeout: 503
	// no_leader, and the CLI exits 1 saying so. Anything else (a refused
	// connection, a bad flag, docker exec's own failures, exit 125-127) is
	// not the outcome under test.
	type outcome struct {
		out  string
		err  error
		took time.Duration
	}
	minority := make(chan outcome, 1)
	go func() {
		start := time.Now()
		out, err := run(c.ctx, nil, "docker", "exec", id, "/raftlockd", "client", "acquire", "--bundle", "/tls/client.pem",
			"--key", "minority-write", "--block=-1", "--timeout", "40s")
		minority <- outcome{out, err, time.Since(start)}
	}()
	if err := load.WaitServedSince(cutAt, 40*time.Second); err != nil {
		t.Fatalf("clients were not served by the connected nodes: %v", err)
	}
	if err := load.WaitAcks(load.Acks()+30, 30*time.Second); err != nil {
		t.Fatalf("while %s was cut off: %v", c.service(leader), err)
	}
	t.Logf("leader %s disconnected; first write through a connected node acknowledged %s later; %d commits acknowledged since",
		c.service(leader), took.Round(time.Millisecond), load.Acks()-before)
	checkFailover(t, took)

	waited := time.Now()
	m := <-minority
	t.Logf("waited %s for the write on the disconnected node to be refused", time.Since(waited).Round(time.Millisecond))
	var exit *exec.ExitError
	switch {
	case m.err == nil:
		t.Fatalf("the disconnected node granted a lease:\n%s", m.out)
	case !errors.As(m.err, &exit) || exit.ExitCode() != 1:
		t.Fatalf("the write on the disconnected node failed for another reason than a refusal: %v", m.err)
	case !strings.HasPrefix(lastLine(m.out), "raftlockd: no_leader: ") || !strings.HasSuffix(lastLine(m.out), "(HTTP 503)"):
		t.Fatalf("the disconnected node's answer to a write: %q, want no_leader (HTTP 503)", lastLine(m.out))
	}
	t.Logf("the disconnected node refused a write after %s: %s", m.took.Round(time.Millisecond), lastLine(m.out))

	reconnectedAt := time.Now()
	reconnect()
	if now := c.inspect(leader, "{{range .NetworkSettings.Networks}}{{.IPAddress}}{{end}}"); now != ip {
		// Its Raft and gossip addresses were resolved at start.
		t.Logf("%s came back with address %s instead of %s; restarting it", c.service(leader), now, ip)
		c.run("restart", c.service(leader))
	}
	c.rejoined(leader, "reconnected", reconnectedAt)
	finish(t, c, load)
	for _, ep := range c.endpoints {
		c.untouched(ep, "minority-write", "the minority's acquire")
	}
}

// downAndUp takes the whole cluster down, keeping its volumes, and brings
// it up again with the nodes started in the reverse order of their
// addresses, so that the recreated containers come back with addresses
// other than those their Raft configuration holds. The nodes elect a
// leader among themselves, serve what was committed before and do not
// bootstrap another cluster.
func downAndUp(t *testing.T, c *composeCluster) {
	before := commitDoc(t, c, c.endpoints[0], "down-and-up", `{"v":"before"}`)
	nodes := c.byAddress()
	// `down` without -v keeps the named volumes and removes the
	// containers: an anonymous volume of one would be left behind, out of
	// reach of a later `down -v`.
	for _, svc := range []string{"certs", "node1", "node2", "node3"} {
		id := strings.TrimSpace(c.run("ps", "-q", svc))
		mounts := strings.TrimSpace(mustRun(t, c.ctx, nil, "docker", "inspect", "-f",
			`{{range .Mounts}}{{if eq .Type "volume"}}{{.Destination}}={{.Name}} {{end}}{{end}}`, id))
		for _, m := range strings.Fields(mounts) {
			if dest, name, _ := strings.Cut(m, "="); len(name) == 64 && !strings.Contains(name, "_") {
				t.Errorf("%s mounts an anonymous volume on %s (%s)", svc, dest, name)
			}
		}
	}
	c.run("down", "-t", "10")
	for i := range c.ids {
		c.ids[i] = ""
	}
	upAt := time.Now()
	for _, n := range nodes {
		c.run("up", "-d", c.service(n.i))
	}
	c.run("up", "-d")
	changed := 0
	for _, n := range nodes {
		if now := c.address(n.i); now != n.ip {
			changed++
			t.Logf("%s: address %s, was %s", c.service(n.i), now, n.ip)
		}
	}
	if changed == 0 {
		t.Log("every node came back with its old address")
	}
	c.cameBack("`down` and `up -d`", upAt, "down-and-up", before, 2)
}

// startOnOthersAddresses stops every node (`stop`: the containers and
// their network stay) and starts the one with the highest address alone:
// Docker gives it the lowest free address of the network, the address
// another node had, which the Raft configuration still holds for that
// node. On its own it is one voter of three: it must not lead (it must not
// count a vote of its own as that other node's). Then the others start
// on addresses each other's, the nodes elect a leader, and what was
// committed before is there.
func startOnOthersAddresses(t *testing.T, c *composeCluster) {
	before := commitDoc(t, c, c.endpoints[0], "swapped", `{"v":"before"}`)
	nodes := c.byAddress()
	c.run("stop", "-t", "10")
	first := nodes[0].i
	startedAt := time.Now()
	mustRun(t, c.ctx, nil, "docker", "start", c.container(first))
	ip := c.address(first)
	took := slices.IndexFunc(nodes, func(n addressed) bool { return n.ip == ip && n.i != first })
	if took < 0 {
		t.Logf("%s came back alone on %s, no other node's address (was %s); the case is not exercised", c.service(first), ip,
			nodes[0].ip)
	} else {
		t.Logf("%s came back alone on %s, %s's address", c.service(first), ip, c.service(nodes[took].i))
	}
	// The container's log also holds what its previous run printed while
	// the others were stopping, when it may rightly have been elected:
	// read only what was printed since this start.
	since := c.inspect(first, "{{.State.StartedAt}}")
	// Several election timeouts (500ms) alone.
	time.Sleep(5 * time.Second)
	logs := mustRun(t, c.ctx, nil, "docker", "logs", "--since", since, c.container(first))
	if !strings.Contains(logs, "raftlockd serving") {
		t.Fatalf("%s's log since its start at %s lacks its start:\n%s", c.service(first), since, logs)
	}
	if strings.Contains(logs, "leader=true") {
		t.Errorf("%s, alone of three voters, became leader:\n%s", c.service(first), logs)
	}
	for _, n := range nodes[1:] {
		mustRun(t, c.ctx, nil, "docker", "start", c.container(n.i))
	}
	c.cameBack("`stop`, then `start` on each other's addresses", startedAt, "swapped", before, first)
}

// addressed is a node (index) and its address on the compose network.
type addressed struct {
	i  int
	ip string
}

// address is node i's address on the compose network.
func (c *composeCluster) address(i int) string {
	return c.inspect(i, "{{range .NetworkSettings.Networks}}{{.IPAddress}}{{end}}")
}

// byAddress lists the nodes with their addresses, the highest first.
func (c *composeCluster) byAddress() []addressed {
	var nodes []addressed
	for i := range c.endpoints {
		nodes = append(nodes, addressed{i, c.address(i)})
	}
	slices.SortFunc(nodes, func(a, b addressed) int { return -cmpIP(a.ip, b.ip) })
	return nodes
}

// cameBack checks the cluster after what (begun at since): every node
// becomes healthy, each serves key as committed before (`{"v":"before"}`,
// under fencing token before), and a new commit through node via gets a
// larger token.
func (c *composeCluster) cameBack(what string, since time.Time, key string, before int64, via int) {
	t := c.t
	t.Helper()
	for i := range c.endpoints {
		c.waitHealthy(i, 90*time.Second)
	}
	t.Logf("%s: three nodes healthy %s later", what, time.Since(since).Round(time.Millisecond))
	for i, ep := range c.endpoints {
		d, err := c.client(ep).GetPublic(c.ctx, "", key)
		if err != nil || string(d.Body) != `{"v":"before"}` {
			t.Fatalf("%s: %s after %s: %q, %v", c.service(i), key, what, d.Body, err)
		}
	}
	if after := commitDoc(t, c, c.endpoints[via], key, `{"v":"after"}`); after <= before {
		t.Fatalf("fencing token %d after %s, but %d was issued before", after, what, before)
	}
}

// cmpIP orders two IPv4 addresses in dotted form.
func cmpIP(a, b string) int {
	pa, pb := net.ParseIP(a).To4(), net.ParseIP(b).To4()
	return bytes.Compare(pa, pb)
}

// untouched fails the test unless key, read through endpoint, was never
// written nor held: it is not found or, as lockd describes a key never
// used, version 0 with no holder.
func (c *composeCluster) untouched(endpoint, key, what string) {
	c.t.Helper()
	cl := c.client(endpoint)
	d, err := cl.GetPublic(c.ctx, "", key)
	if err != nil || d.Exists {
		c.t.Fatalf("%s: %s: %+v, %v", endpoint, what, d, err)
	}
	d2, err := cl.Describe(c.ctx, "", key)
	if !errors.Is(err, errcode.NotFound) && (err != nil || d2.Version != 0 || d2.LeaseID != "" || d2.FencingToken != 0) {
		c.t.Fatalf("%s: %s left a trace: %+v, %v", endpoint, what, d2, err)
	}
}

// refuseWithoutCertificate asks every published port for a lease in plain
// HTTP, and over HTTPS (checking the server with the cluster's CA) without
// a client certificate: both are refused, the second with 401
// certificate_required, and no lease is granted.
func refuseWithoutCertificate(t *testing.T, c *composeCluster) {
	noCert := &tls.Config{MinVersion: tls.VersionTLS12, RootCAs: c.tlsConfig.RootCAs}
	for i, ep := range c.endpoints {
		plain := "http://" + strings.TrimPrefix(ep, "https://")
		for _, tc := range []struct {
			how, url string
			tls      *tls.Config
			key      string
		}{{"plain HTTP", plain, nil, fmt.Sprintf("plain-http-%d", i)},
			{"HTTPS without a client certificate", ep, noCert, fmt.Sprintf("no-cert-%d", i)}} {
			status, body, err := postAcquire(c.ctx, tc.url, tc.tls, tc.key)
			var envelope struct {
				Error   string `json:"error"`
				LeaseID string `json:"lease_id"`
			}
			_ = json.Unmarshal(body, &envelope)
			switch {
			case err == nil && status/100 == 2, envelope.LeaseID != "":
				t.Fatalf("%s: %s: granted: %d %s", c.service(i), tc.how, status, body)
			case tc.tls != nil && (err != nil || status != http.StatusUnauthorized ||
				envelope.Error != errcode.CertificateRequired.Code):
				t.Fatalf("%s: %s: %d %q, %v; want 401 certificate_required", c.service(i), tc.how, status, body, err)
			case err != nil:
				t.Logf("%s: %s refused: %v", c.service(i), tc.how, err)
			default:
				t.Logf("%s: %s refused: %d %s", c.service(i), tc.how, status, strings.TrimSpace(string(body)))
			}
			c.untouched(c.endpoints[0], tc.key, tc.how+" acquire")
		}
	}
}

// postAcquire asks url for a lease on key with a client of its own, which
// dials with cfg (nil: no TLS configuration of ours).
func postAcquire(ctx context.Context, url string, cfg *tls.Config, key string) (int, []byte, error) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	body, _ := json.Marshal(wire.AcquireRequest{Key: key, Owner: "e2e", TTLSeconds: 30, BlockSecs: -1})
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url+"/v1/acquire", bytes.NewReader(body))
	if err != nil {
		return 0, nil, err
	}
	req.Header.Set("Content-Type", "application/json")
	tr := &http.Transport{TLSClientConfig: cfg, DisableKeepAlives: true}
	defer tr.CloseIdleConnections()
	resp, err := (&http.Client{Transport: tr}).Do(req)
	if err != nil {
		return 0, nil, err
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(io.LimitReader(resp.Body, 4<<10))
	return resp.StatusCode, raw, err
}

// restoreThroughFollower saves a backup with the CLI on this host through
// one follower's published port, writes more, and restores the backup
// through the other follower's: the follower forwards the upload to the
// leader (whose advertised endpoint, https://nodeN:9341, this host cannot
// resolve). The CLI presents a node's server bundle, as snapshots ask. Every node then serves the backup's state, and fencing tokens
// keep growing past those issued before the restore.
func restoreThroughFollower(t *testing.T, c *composeCluster) {
	leader, err := workload.WaitLeader(c.ctx, c.endpoints, 20*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	followers := make([]int, 0, 2)
	for i := range c.endpoints {
		if i != leader {
			followers = append(followers, i)
		}
	}
	saveVia, restoreVia := followers[0], followers[1]
	commitDoc(t, c, c.endpoints[leader], "restore-doc", `{"v":"backup"}`)

	file := filepath.Join(t.TempDir(), "backup.db")
	out := c.cli("snapshot", "save", file, "--server", c.endpoints[saveVia])
	t.Logf("through %s: %s", c.service(saveVia), lastLine(out))
	lastDoc := commitDoc(t, c, c.endpoints[saveVia], "restore-doc", `{"v":"later"}`)
	lastLater := commitDoc(t, c, c.endpoints[leader], "restore-later", `{"v":"later"}`)

	out = c.cli("snapshot", "restore", file, "--server", c.endpoints[restoreVia])
	if !strings.Contains(out, "restored snapshot from "+file) {
		t.Fatalf("snapshot restore through %s printed:\n%s", c.service(restoreVia), out)
	}
	t.Logf("leader %s; through follower %s: %s", c.service(leader), c.service(restoreVia), lastLine(out))
	for i, ep := range c.endpoints {
		cl := c.client(ep)
		if d, err := cl.GetPublic(c.ctx, "", "restore-doc"); err != nil || string(d.Body) != `{"v":"backup"}` {
			t.Fatalf("%s: restore-doc after the restore: %+v, %v", c.service(i), d, err)
		}
		if d, err := cl.GetPublic(c.ctx, "", "restore-later"); err != nil || d.Exists {
			t.Fatalf("%s: restore-later (written after the backup) after the restore: %+v, %v", c.service(i), d, err)
		}
	}
	for key, last := range map[string]int64{"restore-doc": lastDoc, "restore-later": lastLater} {
		if next := commitDoc(t, c, c.endpoints[restoreVia], key, `{"v":"after"}`); next <= last {
			t.Fatalf("%s: fencing token %d after the restore, but %d was issued before it", key, next, last)
		}
	}
}

// cli runs an operator command of the raftlockd binary on this host,
// presenting node1's server bundle, and fails the test on an error.
func (c *composeCluster) cli(args ...string) string {
	c.t.Helper()
	return mustRun(c.t, c.ctx, nil, c.bin, append(args, "--bundle", c.serverBundle, "--timeout", "60s")...)
}

// commitDoc commits doc to key through endpoint and returns the fencing
// token of the lease that wrote it.
func commitDoc(t *testing.T, c *composeCluster, endpoint, key, doc string) int64 {
	t.Helper()
	lease, err := c.client(endpoint).Acquire(c.ctx, wire.AcquireRequest{Key: key, Owner: "e2e", TTLSeconds: 30})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := lease.Update(c.ctx, []byte(doc), client.Conditions{}); err != nil {
		t.Fatal(err)
	}
	if err := lease.Release(c.ctx, false); err != nil {
		t.Fatal(err)
	}
	return lease.FencingToken
}

// killLeader kills the leader's container with SIGKILL under load: no
// leadership hand-over, no clean shutdown. The survivors elect a leader and
// serve every client within a bounded time, nothing acknowledged is lost,
// and the killed node, started again on its volume, rejoins by itself.
func killLeader(t *testing.T, c *composeCluster) {
	load := startLoad(t, c, "kill")
	if err := load.WaitAcks(30, 30*time.Second); err != nil {
		t.Fatal(err)
	}
	leader, err := workload.WaitLeader(c.ctx, c.endpoints, 20*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	before := load.Acks()
	id := c.container(leader)
	killedAt := time.Now()
	mustRun(t, c.ctx, nil, "docker", "kill", "--signal", "KILL", id)
	if code := strings.TrimSpace(mustRun(t, c.ctx, nil, "docker", "wait", id)); code != "137" {
		t.Fatalf("%s exited with %s after SIGKILL, want 137", c.service(leader), code)
	}
	took, newLeader := c.servedWithout(t, load, leader, killedAt, "kill-probe")
	t.Logf("leader %s killed (SIGKILL); first write through a survivor acknowledged %s later; %s leads; "+
		"%d commits acknowledged without %s", c.service(leader), took.Round(time.Millisecond), c.service(newLeader),
		load.Acks()-before, c.service(leader))
	checkFailover(t, took)

	// Started again on its volume, the killed node rejoins by itself.
	startedAt := time.Now()
	mustRun(t, c.ctx, nil, "docker", "start", id)
	c.rejoined(leader, "started again", startedAt)
	finish(t, c, load)
}

// servedWithout waits, with node gone since since, until a write through
// another node is acknowledged (took: how long after since), the load is
// served by the others and goes on, and another node leads (newLeader).
func (c *composeCluster) servedWithout(t *testing.T, load *workload.Load, gone int, since time.Time, probe string) (took time.Duration, newLeader int) {
	t.Helper()
	took, err := workload.ProbeWrite(c.ctx, c.others(gone)[0], probe, since, 30*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if err := load.WaitServedSince(since, 40*time.Second); err != nil {
		t.Fatalf("clients were not served by the other nodes: %v", err)
	}
	if err := load.WaitAcks(load.Acks()+30, 30*time.Second); err != nil {
		t.Fatalf("while %s was gone: %v", c.service(gone), err)
	}
	newLeader, err = workload.WaitLeader(c.ctx, c.endpoints, 20*time.Second, gone)
	if err != nil {
		t.Fatal(err)
	}
	return took, newLeader
}

// rejoined waits until node i, back since since, serves writes through
// its published port: it is up and follows the cluster's leader. Whether
// it caught up with everything committed meanwhile is finish's to check.
func (c *composeCluster) rejoined(i int, how string, since time.Time) {
	c.t.Helper()
	took, err := workload.ProbeWrite(c.ctx, c.endpoints[i], "rejoined", since, 60*time.Second)
	if err != nil {
		c.t.Fatalf("%s %s: %v", c.service(i), how, err)
	}
	c.t.Logf("%s %s: serves writes %s later", c.service(i), how, took.Round(time.Millisecond))
}

// checkFailover fails the test when the first write after losing the
// leader took longer than a request's timeout in the probe (5s): that
// means requests waited for the lost leader instead of a new one.
func checkFailover(t *testing.T, took time.Duration) {
	t.Helper()
	if took > 4*time.Second {
		t.Errorf("the first write after the leader was lost took %s (500ms Raft timeouts)", took)
	}
}

func lastLine(s string) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	return lines[len(lines)-1]
}

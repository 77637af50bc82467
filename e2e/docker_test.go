// Package e2e holds tests of raftlockd as it is deployed: the container
// image built from deploy/Dockerfile and the three-node cluster of
// deploy/docker-compose.yml, on this machine's Docker engine. They build
// the static binary and the image (under a unique tag), start the cluster
// under a unique compose project on localhost ports of their own, break
// the leader's container and tear everything down (`down -v`, `rmi`)
// whatever happens. They skip only when no Docker engine answers.
package e2e

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/raftlockd/raftlockd/client"
	"github.com/raftlockd/raftlockd/errcode"
	"github.com/raftlockd/raftlockd/internal/workload"
	"github.com/raftlockd/raftlockd/wire"
)

// scenarioBudget bounds everything after the image is built: bringing the
// cluster up, both fault cases and the checks.
const scenarioBudget = 3 * time.Minute

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
// removes the image when the test ends.
func buildImage(t *testing.T) string {
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
	image := "raftlockd:e2e-" + randomHex(4)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		if _, err := run(ctx, nil, "docker", "rmi", "-f", image); err != nil {
			t.Logf("removing the image: %v", err)
		}
	})
	mustRun(t, ctx, nil, "docker", "build", "-q", "-t", image, dir)
	t.Logf("built %s in %s", image, time.Since(start).Round(time.Millisecond))
	return image
}

// composeCluster is deploy/docker-compose.yml running under its own
// project name.
type composeCluster struct {
	t         *testing.T
	ctx       context.Context
	compose   []string
	env       []string
	endpoints []string // published API of node1..node3
}

// run runs a compose command on the project and fails the test on an error.
func (c *composeCluster) run(args ...string) string {
	c.t.Helper()
	full := append(append([]string{}, c.compose[1:]...), args...)
	return mustRun(c.t, c.ctx, c.env, c.compose[0], full...)
}

func (c *composeCluster) service(i int) string { return fmt.Sprintf("node%d", i+1) }

// container returns the id of node i's container.
func (c *composeCluster) container(i int) string {
	c.t.Helper()
	id := strings.TrimSpace(c.run("ps", "-q", c.service(i)))
	if id == "" {
		c.t.Fatalf("no container for %s", c.service(i))
	}
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
	c := &composeCluster{t: t, ctx: ctx, compose: composeCommand(t)}
	project := "rle2e" + randomHex(4)
	c.compose = append(c.compose, "-p", project, "-f", filepath.Join(repoRoot(t), "deploy", "docker-compose.yml"))
	c.env = []string{"RAFTLOCKD_IMAGE=" + image, "RAFTLOCKD_PUBLISH_HOST=127.0.0.1"}
	for i := 1; i <= 3; i++ {
		port := freePort(t)
		c.env = append(c.env, fmt.Sprintf("RAFTLOCKD_NODE%d_PORT=%s", i, port))
		c.endpoints = append(c.endpoints, "http://127.0.0.1:"+port)
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
	return c
}

func startLoad(t *testing.T, endpoints []string, prefix string) *workload.Load {
	t.Helper()
	seed := time.Now().UnixNano()
	t.Logf("load %s: seed %d", prefix, seed)
	// Requests outlast the servers' default --leader-wait (5s).
	load, err := workload.Start(workload.Config{Endpoints: endpoints, Writers: 6, Seed: seed, Prefix: prefix,
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
	index, err := workload.WaitConverged(c.ctx, c.endpoints, 60*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if err := workload.Verify(c.ctx, c.endpoints, writers); err != nil {
		t.Fatalf("after the nodes converged at applied index %d: %v", index, err)
	}
	t.Logf("all three nodes applied index %d and hold every acknowledged commit", index)
}

// TestDockerCompose runs the compose cluster, writes through node1's
// published port, then stops the leader's container (case 1) and cuts the
// leader off the cluster network (case 2) while writers commit: the other
// nodes keep serving every client and no acknowledged commit is lost.
func TestDockerCompose(t *testing.T) {
	requireDocker(t)
	image := buildImage(t)
	c := startCompose(t, image)

	// A commit through node1's published port is readable through the others.
	cl, err := client.New(c.endpoints[0])
	if err != nil {
		t.Fatal(err)
	}
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
		other, _ := client.New(ep)
		d, err := other.GetPublic(c.ctx, "", "hello")
		if err != nil || string(d.Body) != `{"from":"node1"}` {
			t.Fatalf("read through %s: %q, %v", ep, d.Body, err)
		}
	}

	// The cases share the cluster; each reports to its own subtest.
	for _, tc := range []struct {
		name string
		run  func(*testing.T, *composeCluster)
	}{{"StopLeader", stopLeader}, {"DisconnectLeader", disconnectLeader}} {
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
	load := startLoad(t, c.endpoints, "stop")
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
	mustRun(t, c.ctx, nil, "docker", "wait", id)
	stopped := time.Since(stoppedAt)
	took, err := workload.ProbeWrite(c.ctx, c.others(leader)[0], "stop-probe", stoppedAt, 30*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if err := load.WaitServedSince(stoppedAt, 40*time.Second); err != nil {
		t.Fatalf("clients were not served by the other nodes: %v", err)
	}
	if err := load.WaitAcks(load.Acks()+30, 30*time.Second); err != nil {
		t.Fatalf("while %s was stopped: %v", c.service(leader), err)
	}
	newLeader, err := workload.WaitLeader(c.ctx, c.endpoints, 20*time.Second, leader)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("leader %s stopped (SIGTERM to exit: %s); first write through a survivor acknowledged %s after the stop began; "+
		"%s leads; %d commits acknowledged without %s", c.service(leader), stopped.Round(time.Millisecond),
		took.Round(time.Millisecond), c.service(newLeader), load.Acks()-before, c.service(leader))
	checkFailover(t, took)

	// Started again on its volume, the node rejoins by itself.
	c.run("start", c.service(leader))
	c.waitHealthy(leader, 60*time.Second)
	if _, err := workload.ProbeWrite(c.ctx, c.endpoints[leader], "restarted", time.Now(), 30*time.Second); err != nil {
		t.Fatalf("restarted %s: %v", c.service(leader), err)
	}
	finish(t, c, load)
}

func disconnectLeader(t *testing.T, c *composeCluster) {
	load := startLoad(t, c.endpoints, "disc")
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
	if err := load.WaitServedSince(cutAt, 40*time.Second); err != nil {
		t.Fatalf("clients were not served by the connected nodes: %v", err)
	}
	if err := load.WaitAcks(load.Acks()+30, 30*time.Second); err != nil {
		t.Fatalf("while %s was cut off: %v", c.service(leader), err)
	}
	t.Logf("leader %s disconnected; first write through a connected node acknowledged %s later; %d commits acknowledged since",
		c.service(leader), took.Round(time.Millisecond), load.Acks()-before)
	checkFailover(t, took)

	// The cut-off node accepts no write: asked from inside its container
	// (the image has no shell; the binary is the client).
	out, err := run(c.ctx, nil, "docker", "exec", id, "/raftlockd", "client", "acquire", "--key", "minority-write",
		"--block=-1", "--timeout", "10s")
	if err == nil {
		t.Fatalf("the disconnected node granted a lease:\n%s", out)
	}
	t.Logf("the disconnected node refused a write: %s", lastLine(out))

	reconnect()
	if now := c.inspect(leader, "{{range .NetworkSettings.Networks}}{{.IPAddress}}{{end}}"); now != ip {
		// Its Raft and gossip addresses were resolved at start.
		t.Logf("%s came back with address %s instead of %s; restarting it", c.service(leader), now, ip)
		c.run("restart", c.service(leader))
	}
	c.waitHealthy(leader, 60*time.Second)
	if _, err := workload.ProbeWrite(c.ctx, c.endpoints[leader], "reconnected", time.Now(), 30*time.Second); err != nil {
		t.Fatalf("reconnected %s: %v", c.service(leader), err)
	}
	finish(t, c, load)
	for _, ep := range c.endpoints {
		cl, _ := client.New(ep)
		d, err := cl.GetPublic(c.ctx, "", "minority-write")
		if err != nil || d.Exists {
			t.Fatalf("%s: the minority's write: %+v, %v", ep, d, err)
		}
		if _, err := cl.Describe(c.ctx, "", "minority-write"); !errors.Is(err, errcode.NotFound) {
			t.Fatalf("%s: the minority's acquire left a key record: %v", ep, err)
		}
	}
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

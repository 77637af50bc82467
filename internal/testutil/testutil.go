// Package testutil holds the helpers raftlockd's tests share: starting real
// nodes on loopback ports in temporary directories, building the real
// binary once per test process, and waiting for conditions with deadlines
// instead of sleeping.
package testutil

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"sync"
	"testing"
	"time"

	"github.com/raftlockd/raftlockd/config"
	"github.com/raftlockd/raftlockd/internal/testaddr"
	"github.com/raftlockd/raftlockd/server"
)

// Config returns a single-node configuration on free loopback ports in dir,
// serving mTLS with a server bundle of the shared test CA (see CA).
func Config(t testing.TB, dir string) config.Server {
	t.Helper()
	cfg := config.Default()
	cfg.DataDir = dir
	cfg.Bundle = ServerBundle(t, dir, nil)
	cfg.Listen = "127.0.0.1:0"
	cfg.RaftListen = "127.0.0.1:0"
	cfg.GossipListen = "127.0.0.1:0"
	cfg.GossipProfile = "fast"
	cfg.HeartbeatTimeout = 200 * time.Millisecond
	cfg.ElectionTimeout = 200 * time.Millisecond
	return cfg
}

// Logger returns a logger that writes to the test log only when verbose.
func Logger(t testing.TB) *slog.Logger {
	if testing.Verbose() {
		return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	}
	return slog.New(slog.NewTextHandler(io.Discard, nil))
}

// StartServer starts a node with cfg, waits until it leads and stops it when
// the test ends.
func StartServer(t testing.TB, cfg config.Server) *server.Server {
	t.Helper()
	srv, err := server.Start(cfg, Logger(t))
	if err != nil {
		t.Fatalf("start server: %v", err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = srv.Close(ctx)
	})
	WaitFor(t, 10*time.Second, "node to lead", func() bool { return srv.Node().IsLeader() })
	return srv
}

// WaitFor polls cond until it holds or timeout passes.
func WaitFor(t testing.TB, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %s waiting for %s", timeout, what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// FreeAddr returns a loopback address that stays free for the caller; see
// testaddr.Free.
func FreeAddr(t testing.TB) string {
	t.Helper()
	return testaddr.Free(t)
}

var (
	buildOnce sync.Once
	buildPath string
	buildErr  error
)

// RemoveBinary deletes the binary Binary built; call it from TestMain after
// the tests ran.
func RemoveBinary() {
	if buildPath != "" {
		_ = os.RemoveAll(filepath.Dir(buildPath))
	}
}

// Binary builds cmd/raftlockd once per test process and returns its path.
func Binary(t testing.TB) string {
	t.Helper()
	buildOnce.Do(func() {
		_, file, _, _ := runtime.Caller(0)
		root := filepath.Join(filepath.Dir(file), "..", "..")
		dir, err := os.MkdirTemp("", "raftlockd-bin-")
		if err != nil {
			buildErr = err
			return
		}
		buildPath = filepath.Join(dir, "raftlockd")
		cmd := exec.Command("go", "build", "-o", buildPath, "./cmd/raftlockd")
		cmd.Dir = root
		if out, err := cmd.CombinedOutput(); err != nil {
			buildErr = fmt.Errorf("go build: %v\n%s", err, out)
		}
	})
	if buildErr != nil {
		t.Fatal(buildErr)
	}
	return buildPath
}

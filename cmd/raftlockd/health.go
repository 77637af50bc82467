package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/raftlockd/raftlockd/wire"
)

const healthEnv = "RAFTLOCKD_HEALTH_"

// defaultHealthServer is the node a health check probes when no --server
// is given: the one this environment's RAFTLOCKD_LISTEN starts (as in the
// container image, where the server and its health check share the
// environment), reached over loopback when it listens on every interface;
// otherwise the server's default address.
func defaultHealthServer() string {
	listen := os.Getenv("RAFTLOCKD_LISTEN")
	if listen == "" {
		return "http://127.0.0.1:9341"
	}
	host, port, err := net.SplitHostPort(listen)
	if err != nil {
		return "http://" + listen
	}
	if ip := net.ParseIP(host); host == "" || ip != nil && ip.IsUnspecified() {
		host = "127.0.0.1"
		if ip != nil && ip.To4() == nil {
			host = "::1"
		}
	}
	return "http://" + net.JoinHostPort(host, port)
}

func newHealthCmd() *cobra.Command {
	var server string
	var live bool
	var timeout time.Duration
	cmd := &cobra.Command{
		Use:   "health",
		Short: "Probe a server's readiness (or liveness) and exit 0 or 1",
		Long: `Probe a raftlockd server: GET /readyz (the node knows a Raft leader), or
GET /healthz with --live (the process serves HTTP). Exits 0 when the probe
answers 200 and 1 otherwise, printing why, so that it can serve as a
container health check in an image without a shell.

Without --server it probes the address in RAFTLOCKD_LISTEN (loopback when
that is 0.0.0.0 or [::]), else http://127.0.0.1:9341.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if server == "" {
				server = defaultHealthServer()
			}
			if !strings.Contains(server, "://") {
				server = "http://" + server
			}
			path := "/readyz"
			if live {
				path = "/healthz"
			}
			url := strings.TrimRight(server, "/") + path
			ctx, cancel := context.WithTimeout(context.Background(), timeout)
			defer cancel()
			req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
			if err != nil {
				return fmt.Errorf("health: %w", err)
			}
			hc := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}} // no proxy from the environment
			resp, err := hc.Do(req)
			if err != nil {
				return fmt.Errorf("health: %w", err)
			}
			defer resp.Body.Close()
			body, _ := io.ReadAll(io.LimitReader(resp.Body, 4<<10))
			node := resp.Header.Get(wire.HeaderServedBy)
			if resp.StatusCode != http.StatusOK {
				return fmt.Errorf("health: GET %s: %s (node %q): %s", url, resp.Status, node, describeProblem(body))
			}
			fmt.Fprintf(cmd.OutOrStdout(), "%s: %s (node %s)\n", url, strings.TrimSpace(string(body)), node)
			return nil
		},
	}
	f := cmd.Flags()
	f.StringVar(&server, "server", "", "server URL (default: from RAFTLOCKD_LISTEN, else http://127.0.0.1:9341)")
	f.BoolVar(&live, "live", false, "check liveness (/healthz) instead of readiness (/readyz)")
	f.DurationVar(&timeout, "timeout", 2*time.Second, "give up after this long")
	bindEnv(cmd, healthEnv)
	return cmd
}

// describeProblem renders an error envelope (or any body) on one line.
func describeProblem(body []byte) string {
	var e struct {
		Error      string `json:"error"`
		Detail     string `json:"detail"`
		RetryAfter int64  `json:"retry_after_seconds"`
	}
	if json.Unmarshal(body, &e) == nil && e.Error != "" {
		s := e.Error
		if e.Detail != "" {
			s += ": " + e.Detail
		}
		if e.RetryAfter > 0 {
			s += fmt.Sprintf(" (retry after %ds)", e.RetryAfter)
		}
		return s
	}
	return strings.TrimSpace(string(body))
}

package main

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/raftlockd/raftlockd/auth"
	"github.com/raftlockd/raftlockd/wire"
)

const healthEnv = "RAFTLOCKD_HEALTH_"

// defaultHealthServer is the node a health check probes when no --server
// is given, with scheme: the one this environment's RAFTLOCKD_LISTEN
// starts (as in the container image, where the server and its health
// check share the environment), reached over loopback when it listens on
// every interface; otherwise the server's default address.
func defaultHealthServer(scheme string) string {
	listen := os.Getenv("RAFTLOCKD_LISTEN")
	if listen == "" {
		return scheme + "://" + defaultAPIAddr
	}
	host, port, err := net.SplitHostPort(listen)
	if err != nil {
		return scheme + "://" + listen
	}
	if ip := net.ParseIP(host); host == "" || ip != nil && ip.IsUnspecified() {
		host = "127.0.0.1"
		if ip != nil && ip.To4() == nil {
			host = "::1"
		}
	}
	return scheme + "://" + net.JoinHostPort(host, port)
}

// healthBundle is the bundle whose CA the health check verifies the
// server with: --bundle, else the server's own as this environment
// configures it (RAFTLOCKD_BUNDLE, else the data directory's tls folder);
// none when this environment's server runs with mTLS disabled.
func healthBundle(path string) (*auth.Bundle, error) {
	if path == "" {
		if mtlsDisabledHere() {
			return nil, nil
		}
		path = os.Getenv("RAFTLOCKD_BUNDLE")
	}
	return findBundle(path, healthBundles...)
}

// healthBundles are the files whose CA health verifies a server with, in
// the order it looks for them.
var healthBundles = []string{auth.ServerFile, auth.CAFile, auth.ClientFile, auth.TCClientFile}

// mtlsDisabledHere reports whether this environment's server serves plain
// HTTP (RAFTLOCKD_DISABLE_MTLS).
func mtlsDisabledHere() bool {
	off, _ := strconv.ParseBool(os.Getenv("RAFTLOCKD_DISABLE_MTLS"))
	return off
}

// probeTLS reports whether a server named without a scheme, the default
// one included, is probed over https: when the bundle b can verify it, or
// when insecure asks not to verify it, unless this environment's server
// serves plain HTTP. The probes need no certificate, so https works
// without a bundle.
func probeTLS(b *auth.Bundle, insecure bool) bool {
	return b != nil || insecure && !mtlsDisabledHere()
}

func newHealthCmd() *cobra.Command {
	var server, bundle string
	var live, insecure bool
	var timeout time.Duration
	cmd := &cobra.Command{
		Use:   "health",
		Short: "Probe a server's readiness (or liveness) and exit 0 or 1",
		Long: `Probe a raftlockd server: GET /readyz (the node knows a Raft leader and
has caught up with it), or GET /healthz with --live (the process serves
HTTP). Exits 0 when the probe answers 200 and 1 otherwise, printing why,
so that it can serve as a container health check in an image without a
shell.

Without --server it probes the address in RAFTLOCKD_LISTEN (loopback when
that is 0.0.0.0 or [::]), else 127.0.0.1:9341. That address, and a --server
without a scheme, is probed over https when it finds a bundle or is given
--insecure-skip-verify, and over http when it finds none and is not, or
when RAFTLOCKD_DISABLE_MTLS is true and no --bundle is given. The probes need no certificate, but the server's is verified against the
CA of a bundle: --bundle, else the one the server in the same environment
uses (RAFTLOCKD_BUNDLE, else server.pem, ca.pem, client.pem or tcclient.pem
in $RAFTLOCKD_DATA_DIR/tls or the default data directory's tls folder).`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if timeout <= 0 {
				return fmt.Errorf("health: --timeout %v: a probe needs a positive time to wait", timeout)
			}
			b, err := healthBundle(bundle)
			if err != nil {
				return fmt.Errorf("health: %w", err)
			}
			overTLS := probeTLS(b, insecure)
			if server == "" {
				server = defaultHealthServer(scheme(overTLS))
			}
			server = baseURL(server, overTLS)
			tr := &http.Transport{DisableKeepAlives: true} // no proxy from the environment
			if strings.HasPrefix(server, "https://") {
				switch {
				case insecure:
					tr.TLSClientConfig = &tls.Config{InsecureSkipVerify: true} //nolint:gosec // asked for
				case b == nil:
					return fmt.Errorf("health: %w; or pass --insecure-skip-verify to probe without verifying the server",
						errNoBundle(server, "--bundle, "+healthEnv+"BUNDLE, RAFTLOCKD_BUNDLE", healthBundles...))
				default:
					tr.TLSClientConfig = &tls.Config{MinVersion: tls.VersionTLS12, RootCAs: b.Roots()}
				}
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
			resp, err := (&http.Client{Transport: tr}).Do(req)
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
	f.StringVar(&server, "server", "", "server URL (default: from RAFTLOCKD_LISTEN, else 127.0.0.1:9341; without a scheme, https with a bundle or --insecure-skip-verify)")
	f.StringVar(&bundle, "bundle", "", "bundle whose CA the server's certificate is verified with (default: the server's, see above)")
	f.BoolVar(&insecure, "insecure-skip-verify", false, "probe an https server without verifying its certificate")
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

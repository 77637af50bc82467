package server

import (
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/raftlockd/raftlockd/auth"
	"github.com/raftlockd/raftlockd/cluster"
	"github.com/raftlockd/raftlockd/config"
)

// openBundle loads the node's server bundle. The single-node default
// creates a CA and its server, client and TC-client bundles in the data
// directory on first start; a node of a larger cluster needs a bundle
// issued by the cluster's CA.
func openBundle(cfg config.Server, log *slog.Logger) (*auth.Source, error) {
	path := cfg.BundlePath()
	if _, err := os.Stat(path); errors.Is(err, fs.ErrNotExist) && cfg.Bundle == "" {
		if !cfg.SingleNode() {
			return nil, fmt.Errorf("server: no server bundle at %s: the nodes of a cluster need bundles of one CA "+
				"(raftlockd auth new cluster --dir DIR --host NODE ...), passed with --bundle; "+
				"or run with --disable-mtls for development", path)
		}
		created, err := auth.Bootstrap(cfg.TLSDir(), serverHosts(cfg))
		if err != nil {
			return nil, fmt.Errorf("server: create certificates: %w", err)
		}
		if created {
			log.Info("created a CA and server, client and TC-client bundles; clients on this machine find them "+
				"without flags (or pass --bundle)", "client_bundle", filepath.Join(cfg.TLSDir(), auth.ClientFile),
				"tcclient_bundle", filepath.Join(cfg.TLSDir(), auth.TCClientFile), "ca", filepath.Join(cfg.TLSDir(), auth.CAFile))
		}
	}
	src, err := auth.OpenSource(path)
	if err != nil {
		return nil, fmt.Errorf("server: %w", err)
	}
	if len(src.Bundle().GossipKey) == 0 && !cfg.SingleNode() {
		log.Warn("the server bundle carries no gossip key: gossip is not encrypted", "bundle", path)
	}
	return src, nil
}

// serverHosts are the names the single-node default's certificate is
// valid for: the machine's, and the address the API listens on.
func serverHosts(cfg config.Server) []string {
	hosts := auth.DefaultHosts()
	if h, _, err := net.SplitHostPort(cfg.Listen); err == nil && h != "" {
		if ip := net.ParseIP(h); ip == nil || !ip.IsUnspecified() {
			hosts = append(hosts, h)
		}
	}
	return hosts
}

// peerTLS is the cluster's internal TLS, nil with mTLS disabled.
func peerTLS(src *auth.Source) cluster.PeerTLS {
	if src == nil {
		return nil
	}
	return src
}

func gossipKey(src *auth.Source) []byte {
	if src == nil {
		return nil
	}
	return src.Bundle().GossipKey
}

// gossipAccept are the further gossip keys the node reads (see
// auth.Bundle.Extend).
func gossipAccept(src *auth.Source) [][]byte {
	if src == nil {
		return nil
	}
	return src.Bundle().GossipAccept
}

// certWarnBefore is how long before the node's certificate expires a start
// or a reload warns that it needs rotating: an expired certificate shuts
// the node out of its cluster and its clients out of the node.
const certWarnBefore = 30 * 24 * time.Hour

// warnExpiry logs a warning when the certificate src serves expires within
// certWarnBefore of now.
func warnExpiry(log *slog.Logger, src *auth.Source, now time.Time) {
	if src == nil {
		return
	}
	c := src.Bundle().Cert
	if left := c.NotAfter.Sub(now); left < certWarnBefore {
		log.Warn("the node's certificate expires soon: rotate it (replace the bundle file, then SIGHUP)",
			"bundle", src.Path(), "serial", auth.SerialOf(c), "not_after", c.NotAfter, "left", left.Round(time.Minute))
	}
}

// certExpiry is the gauge of when the certificate src serves expires,
// read at every scrape, so that it follows reloads.
func certExpiry(src *auth.Source) prometheus.Collector {
	return prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "raftlockd_tls_certificate_expiry_timestamp_seconds",
		Help: "When the certificate of this node's bundle expires (Unix time)."},
		func() float64 { return float64(src.Bundle().Cert.NotAfter.Unix()) })
}

package main

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/raftlockd/raftlockd/auth"
	"github.com/raftlockd/raftlockd/client"
	"github.com/raftlockd/raftlockd/config"
)

// How client and operator commands reach a server: --server, --bundle and
// --timeout. Without --bundle a command uses the bundle of its kind that a
// server on this machine keeps in its data directory (the single-node
// default creates them): client.pem for leases, state and queues,
// tcclient.pem for the coordinator's client endpoints, server.pem for
// operating the cluster. So on the server's machine commands work without
// flags.

// defaultAPIAddr is where `raftlockd server` listens by default.
const defaultAPIAddr = "127.0.0.1:9341"

// bundleAnnotation names, on a command, the file in the data directory's
// tls folder it presents when --bundle is not given; subcommands inherit it.
const bundleAnnotation = "raftlockd_bundle"

// useBundle makes cmds (and their subcommands) present file by default.
func useBundle(file string, cmds ...*cobra.Command) {
	for _, c := range cmds {
		if c.Annotations == nil {
			c.Annotations = map[string]string{}
		}
		c.Annotations[bundleAnnotation] = file
	}
}

// bundleFile is the default bundle of cmd: the nearest annotation among it
// and its parents.
func bundleFile(cmd *cobra.Command) string {
	for c := cmd; c != nil; c = c.Parent() {
		if f := c.Annotations[bundleAnnotation]; f != "" {
			return f
		}
	}
	return auth.ClientFile
}

// tlsDir is where a server on this machine keeps its bundles:
// $RAFTLOCKD_DATA_DIR/tls, else the default data directory's.
func tlsDir() string {
	dir := os.Getenv("RAFTLOCKD_DATA_DIR")
	if dir == "" {
		dir = config.DefaultDataDir()
	}
	return filepath.Join(dir, "tls")
}

// findBundle loads the bundle at path or, when path is empty, the first
// of files that exists in tlsDir. It returns nil and no error when there
// is none.
func findBundle(path string, files ...string) (*auth.Bundle, error) {
	if path == "" {
		dir := tlsDir()
		for _, f := range files {
			p := filepath.Join(dir, f)
			_, err := os.Stat(p)
			if err == nil {
				path = p
				break
			}
			if !errors.Is(err, fs.ErrNotExist) {
				return nil, fmt.Errorf("bundle: %w (pass --bundle)", err)
			}
		}
		if path == "" {
			return nil, nil
		}
	}
	b, err := auth.LoadBundle(path)
	if err != nil {
		return nil, fmt.Errorf("--bundle %s: %w", path, err)
	}
	return b, nil
}

// scheme is the API's URL scheme with a bundle in use (tls) or without.
func scheme(tls bool) string {
	if tls {
		return "https"
	}
	return "http"
}

// baseURL is the server URL to call: server, or the default address, with
// https:// when it names no scheme and a bundle is in use.
func baseURL(server string, tls bool) string {
	if server == "" {
		server = defaultAPIAddr
	}
	if strings.Contains(server, "://") {
		return server
	}
	return scheme(tls) + "://" + server
}

// serverURLs are the URLs of the comma-separated servers list names (the
// default server when it names none), as baseURL makes them. An empty
// entry of a list, such as a stray comma leaves, is refused (naming flag)
// rather than taken for the default server.
func serverURLs(flag, list string, tls bool) ([]string, error) {
	if strings.TrimSpace(list) == "" {
		return []string{baseURL("", tls)}, nil
	}
	var urls []string
	for _, s := range strings.Split(list, ",") {
		s = strings.TrimSpace(s)
		if s == "" {
			return nil, fmt.Errorf("%s %q: the list has an empty entry; name each server once, comma-separated", flag, list)
		}
		urls = append(urls, baseURL(s, tls))
	}
	return urls, nil
}

// errNoBundle explains that an https URL needs a bundle none was found for.
func errNoBundle(url, flag string, files ...string) error {
	return fmt.Errorf("%s is served over TLS, but no bundle was given (%s) and there is no %s in %s",
		url, flag, strings.Join(files, " or "), tlsDir())
}

// conn holds the connection flags of a group of commands.
type conn struct {
	server  string
	bundle  string
	timeout time.Duration
}

// register adds the connection flags to cmd, for it and its subcommands,
// which present file unless a subcommand names another with useBundle;
// which describes the default bundle in the help.
func (c *conn) register(cmd *cobra.Command, file, which string) {
	useBundle(file, cmd)
	if which == "" {
		which = file
	}
	pf := cmd.PersistentFlags()
	pf.StringVar(&c.server, "server", "", fmt.Sprintf("server URL, or several servers of one cluster, comma-separated: "+
		"the next is used when one cannot be reached (default https://%s with a bundle, http://%[1]s without; "+
		"a URL without a scheme gets https:// with a bundle)", defaultAPIAddr))
	pf.StringVar(&c.bundle, "bundle", "", fmt.Sprintf("bundle (PEM: certificate, key and CA) to present and to check the server "+
		"with (default: %s in $RAFTLOCKD_DATA_DIR/tls, else in %s, when it exists)", which, filepath.Join(config.DefaultDataDir(), "tls")))
	pf.DurationVar(&c.timeout, "timeout", 0, "give up after this long (0: no limit)")
}

// dial returns a client for cmd's server, presenting its bundle.
func (c *conn) dial(cmd *cobra.Command, opts ...client.Option) (*client.Client, error) {
	if c.timeout < 0 {
		return nil, fmt.Errorf("--timeout %s: give a positive duration, or 0 for no limit", c.timeout)
	}
	file := bundleFile(cmd)
	b, err := findBundle(c.bundle, file)
	if err != nil {
		return nil, err
	}
	urls, err := serverURLs("--server", c.server, b != nil)
	if err != nil {
		return nil, err
	}
	for _, url := range urls {
		if b == nil && strings.HasPrefix(url, "https://") {
			return nil, errNoBundle(url, "--bundle, "+clientEnv+"BUNDLE", file)
		}
	}
	if b != nil {
		opts = append(opts, client.WithBundle(b))
	}
	return client.New(strings.Join(urls, ","), opts...)
}

// context bounds a command's calls by --timeout.
func (c *conn) context() (context.Context, context.CancelFunc) {
	if c.timeout <= 0 {
		return context.WithCancel(context.Background())
	}
	return context.WithTimeout(context.Background(), c.timeout)
}

// open is dial and context: what a command needs to make its calls. The
// cancel function is never nil.
func (c *conn) open(cmd *cobra.Command, opts ...client.Option) (*client.Client, context.Context, context.CancelFunc, error) {
	cl, err := c.dial(cmd, opts...)
	if err != nil {
		return nil, nil, func() {}, err
	}
	ctx, cancel := c.context()
	return cl, ctx, cancel, nil
}

package auth

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
)

// The files of a directory of bundles, as the single-node default and
// `raftlockd auth new cluster` write them.
const (
	CAFile       = "ca.pem"
	ServerFile   = "server.pem"
	ClientFile   = "client.pem"
	TCClientFile = "tcclient.pem"
)

// Bootstrap writes a new CA and a server, client and TC-client bundle
// into dir, unless dir already holds a server bundle. The server
// certificate is valid for hosts; the client certificate may use every
// namespace. It reports whether it wrote anything.
func Bootstrap(dir string, hosts []string) (bool, error) {
	if _, err := os.Stat(filepath.Join(dir, ServerFile)); err == nil {
		return false, nil
	} else if !errors.Is(err, fs.ErrNotExist) {
		return false, fmt.Errorf("auth: %w", err)
	}
	ca, err := NewCA(IssueOptions{Name: "raftlockd CA"})
	if err != nil {
		return false, err
	}
	srv, err := ca.Issue(RoleServer, IssueOptions{Name: "raftlockd server", Hosts: hosts})
	if err != nil {
		return false, err
	}
	cl, err := ca.Issue(RoleClient, IssueOptions{Name: "raftlockd client", Perms: []Perm{{Namespace: "*", Write: true}}})
	if err != nil {
		return false, err
	}
	tcc, err := ca.Issue(RoleTCClient, IssueOptions{Name: "raftlockd tcclient"})
	if err != nil {
		return false, err
	}
	// The server bundle goes last: its presence means the set is complete.
	for _, f := range []struct {
		name string
		b    *Bundle
	}{{CAFile, ca}, {ClientFile, cl}, {TCClientFile, tcc}, {ServerFile, srv}} {
		if err := f.b.WriteFile(filepath.Join(dir, f.name)); err != nil {
			return false, err
		}
	}
	return true, nil
}

// DefaultHosts are the names a single-node default server answers on: the
// loopback addresses, localhost and the machine's host name.
func DefaultHosts() []string {
	hosts := []string{"127.0.0.1", "::1", "localhost"}
	if h, err := os.Hostname(); err == nil && h != "" {
		hosts = append(hosts, h)
	}
	return hosts
}

package main

import (
	"encoding/json"
	"os"
)

// stateFile, in --data-dir, records the ports of the last start, so that --keep-state can
// continue that cluster where its clients expect it.
const stateFile = "state.json"

// clusterState is what a continued cluster keeps besides etcd's data and the certificates.
type clusterState struct {
	APIServerPort  int `json:"apiserverPort"`
	EtcdClientPort int `json:"etcdClientPort"`
	EtcdPeerPort   int `json:"etcdPeerPort"`
}

// continued is true for the state of a previous start (a fresh cluster has no ports yet).
func (s *clusterState) continued() bool { return s.APIServerPort != 0 }

// readState returns the previous start's state, or nil when there is nothing to continue (no
// state file, or certificates missing: then the start is a fresh cluster).
func readState(path, pkiDir string) *clusterState {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil
	}
	var s clusterState
	if json.Unmarshal(data, &s) != nil || !s.continued() {
		return nil
	}
	for _, name := range []string{"ca.crt", "ca.key", "apiserver.crt", "apiserver.key", "sa.key", "sa.pub", "admin.crt", "admin.key", "kubelet.crt", "kubelet.key", "controller-manager.crt", "controller-manager.key", "scheduler.crt", "scheduler.key"} {
		if _, err := os.Stat(pki{dir: pkiDir}.file(name)); err != nil {
			return nil
		}
	}
	return &s
}

// writeState records this start's ports (write then rename: never half a file).
func writeState(path string, s clusterState) error {
	data, err := json.Marshal(s)
	if err != nil {
		return err
	}
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, data, 0o600); err != nil {
		return err
	}
	return os.Rename(tmp, path)
}

// Command testcluster runs a whole Kubernetes control plane in one process for development and
// tests: embedded etcd, kube-apiserver, kube-controller-manager and kube-scheduler, all built from
// the pinned k8s.io/kubernetes module. There is no kubelet: llmbatch.devcluster registers nodes and
// runs pods as local processes.
//
// It serves TLS on 127.0.0.1 (a free port unless --port is given), authenticates with client
// certificates, authorizes with RBAC, signs service-account tokens, and writes an admin kubeconfig.
// SIGTERM or SIGINT stops everything and removes the state it created.
//
// Every start is a fresh cluster (etcd's data wiped, new certificates) unless --keep-state is
// given: then a start continues the cluster of the previous one in --data-dir, with its etcd
// data, its certificates and its ports, so that clients holding the old kubeconfig (and pods
// holding service-account tokens) reconnect as to a restarted API server.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"net"
	"net/url"
	"os"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/spf13/pflag"
	"go.etcd.io/etcd/server/v3/embed"
	utilerrors "k8s.io/apimachinery/pkg/util/errors"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
	logsapi "k8s.io/component-base/logs/api/v1"
	"k8s.io/klog/v2"

	utilfeature "k8s.io/apiserver/pkg/util/feature"
	apiserverapp "k8s.io/kubernetes/cmd/kube-apiserver/app"
	apiserveroptions "k8s.io/kubernetes/cmd/kube-apiserver/app/options"
	kcmapp "k8s.io/kubernetes/cmd/kube-controller-manager/app"
	kcmoptions "k8s.io/kubernetes/cmd/kube-controller-manager/app/options"
	schedapp "k8s.io/kubernetes/cmd/kube-scheduler/app"
	schedoptions "k8s.io/kubernetes/cmd/kube-scheduler/app/options"
)

// defaultControllers are the kube-controller-manager controllers a batch workload on process
// nodes needs. Controllers that act on volumes, networking or certificates are left out.
var defaultControllers = strings.Join([]string{
	"job-controller",
	"cronjob-controller",
	"garbage-collector-controller",
	"namespace-controller",
	"serviceaccount-controller",
	"serviceaccount-token-controller",
	"legacy-serviceaccount-token-cleaner-controller",
	"pod-garbage-collector-controller",
	"ttl-after-finished-controller",
	"node-lifecycle-controller",
	"taint-eviction-controller",
	"root-ca-certificate-publisher-controller",
	"clusterrole-aggregation-controller",
	"deployment-controller",
	"replicaset-controller",
	"disruption-controller",
	"resourcequota-controller",
}, ",")

type config struct {
	kubeconfig       string
	dataDir          string
	port             int
	controllers      string
	exitWithParent   bool
	verbosity        int
	nodeMonitorGrace time.Duration
	keepState        bool
}

func main() {
	var cfg config
	fs := flag.NewFlagSet("testcluster", flag.ExitOnError)
	fs.StringVar(&cfg.kubeconfig, "kubeconfig", "", "write the admin kubeconfig here (required)")
	fs.StringVar(&cfg.dataDir, "data-dir", "", "state directory (certificates, etcd); a temporary directory removed on exit when empty")
	fs.IntVar(&cfg.port, "port", 0, "apiserver port on 127.0.0.1; 0 picks a free port")
	fs.StringVar(&cfg.controllers, "controllers", defaultControllers, "kube-controller-manager --controllers")
	fs.BoolVar(&cfg.exitWithParent, "exit-with-parent", false, "stop when the parent process goes away")
	fs.IntVar(&cfg.verbosity, "v", 0, "klog verbosity of every component")
	fs.DurationVar(&cfg.nodeMonitorGrace, "node-monitor-grace-period", 40*time.Second, "kube-controller-manager --node-monitor-grace-period")
	fs.BoolVar(&cfg.keepState, "keep-state", false, "continue the cluster of the last start in --data-dir (its etcd data, certificates and ports) instead of starting a fresh one")
	_ = fs.Parse(os.Args[1:])
	if cfg.kubeconfig == "" {
		fmt.Fprintln(os.Stderr, "testcluster: --kubeconfig is required")
		os.Exit(2)
	}
	if err := run(cfg); err != nil {
		fmt.Fprintf(os.Stderr, "testcluster: %v\n", err)
		os.Exit(1)
	}
}

func run(cfg config) error {
	start := time.Now()
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	if cfg.exitWithParent {
		ctx = watchParent(ctx)
	}

	removeDataDir := false
	if cfg.dataDir == "" {
		dir, err := os.MkdirTemp("", "testcluster-")
		if err != nil {
			return err
		}
		cfg.dataDir = dir
		removeDataDir = true
	}
	if err := os.MkdirAll(cfg.dataDir, 0o700); err != nil {
		return err
	}
	defer func() {
		if removeDataDir {
			_ = os.RemoveAll(cfg.dataDir)
		}
	}()
	pkiDir := filepath.Join(cfg.dataDir, "pki")
	etcdDir := filepath.Join(cfg.dataDir, "etcd")
	statePath := filepath.Join(cfg.dataDir, stateFile)
	var kept clusterState
	continuing := false
	if cfg.keepState {
		if previous := readState(statePath, pkiDir); previous != nil {
			kept, continuing = *previous, true
			fmt.Printf("testcluster: continuing the cluster in %s\n", cfg.dataDir)
		}
	}
	if !continuing {
		// A fresh etcd every start: the cluster is disposable.
		_ = os.RemoveAll(etcdDir)
	}
	apiPort := kept.APIServerPort
	if cfg.port != 0 {
		apiPort = cfg.port
	}

	// Listener for the apiserver first, so that the port is known to every certificate and kubeconfig.
	listener, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(apiPort)))
	if err != nil {
		return fmt.Errorf("listen: %w", err)
	}
	port := listener.Addr().(*net.TCPAddr).Port
	server := fmt.Sprintf("https://127.0.0.1:%d", port)

	p := pki{dir: pkiDir}
	if !continuing {
		if p, err = writePKI(pkiDir); err != nil {
			return fmt.Errorf("certificates: %w", err)
		}
	}
	kcmKubeconfig := filepath.Join(cfg.dataDir, "controller-manager.kubeconfig")
	schedKubeconfig := filepath.Join(cfg.dataDir, "scheduler.kubeconfig")
	for path, user := range map[string]string{
		kcmKubeconfig:   "controller-manager",
		schedKubeconfig: "scheduler",
	} {
		if err := writeKubeconfig(path, server, p, user); err != nil {
			return err
		}
	}

	// The etcd ports are probed free and bound a moment later; retry if another process took one.
	// A continued cluster asks for its previous ports first.
	var etcd *embed.Etcd
	var etcdURL string
	clientPort, peerPort := kept.EtcdClientPort, kept.EtcdPeerPort
	for attempt := 1; ; attempt++ {
		etcd, etcdURL, clientPort, peerPort, err = startEtcd(etcdDir, clientPort, peerPort)
		if err == nil {
			break
		}
		if attempt == 3 || !strings.Contains(err.Error(), "address already in use") {
			return fmt.Errorf("etcd: %w", err)
		}
		if !continuing {
			_ = os.RemoveAll(etcdDir)
		}
		clientPort, peerPort = 0, 0
	}
	defer etcd.Close()
	next := clusterState{APIServerPort: port, EtcdClientPort: clientPort, EtcdPeerPort: peerPort}
	if err := writeState(statePath, next); err != nil {
		return err
	}

	// klog: one configuration for all components.
	klogFlags := flag.NewFlagSet("klog", flag.ContinueOnError)
	klog.InitFlags(klogFlags)
	_ = klogFlags.Set("v", strconv.Itoa(cfg.verbosity))

	compCtx, cancelComponents := context.WithCancel(context.Background())
	defer cancelComponents()
	var wg sync.WaitGroup
	errCh := make(chan error, 3)
	goRun := func(name string, f func() error) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := f(); err != nil && compCtx.Err() == nil {
				errCh <- fmt.Errorf("%s: %w", name, err)
			}
		}()
	}

	apiserverArgs := []string{
		"--etcd-servers=" + etcdURL,
		"--advertise-address=127.0.0.1",
		"--bind-address=127.0.0.1",
		"--tls-cert-file=" + p.file("apiserver.crt"),
		"--tls-private-key-file=" + p.file("apiserver.key"),
		"--client-ca-file=" + p.file("ca.crt"),
		"--authorization-mode=RBAC",
		"--service-account-issuer=https://kubernetes.default.svc.cluster.local",
		"--service-account-key-file=" + p.file("sa.pub"),
		"--service-account-signing-key-file=" + p.file("sa.key"),
		"--service-cluster-ip-range=10.96.0.0/16",
		"--endpoint-reconciler-type=none",
		"--allow-privileged=true",
		"--profiling=false",
		"--enable-priority-and-fairness=false",
		"--storage-media-type=application/vnd.kubernetes.protobuf",
		"--enable-garbage-collector=true",
		"--event-ttl=1h",
		// The node agent serves container logs with a certificate from this CA.
		"--kubelet-certificate-authority=" + p.file("ca.crt"),
		"--kubelet-client-certificate=" + p.file("admin.crt"),
		"--kubelet-client-key=" + p.file("admin.key"),
		"--kubelet-preferred-address-types=InternalIP",
	}
	apiserverOpts := apiserveroptions.NewServerRunOptions()
	apiserverFS := pflag.NewFlagSet("kube-apiserver", pflag.ContinueOnError)
	for _, f := range apiserverOpts.Flags().FlagSets {
		apiserverFS.AddFlagSet(f)
	}
	if err := apiserverFS.Parse(apiserverArgs); err != nil {
		return fmt.Errorf("kube-apiserver flags: %w", err)
	}
	apiserverOpts.SecureServing.Listener = listener
	apiserverOpts.SecureServing.BindPort = port
	if err := apiserverOpts.GenericServerRunOptions.ComponentGlobalsRegistry.Set(); err != nil {
		return err
	}
	if err := logsapi.ValidateAndApply(apiserverOpts.Logs, utilfeature.DefaultFeatureGate); err != nil {
		return err
	}
	completed, err := apiserverOpts.Complete(compCtx)
	if err != nil {
		return fmt.Errorf("kube-apiserver: %w", err)
	}
	if errs := completed.Validate(); len(errs) != 0 {
		return fmt.Errorf("kube-apiserver: %w", utilerrors.NewAggregate(errs))
	}
	goRun("kube-apiserver", func() error { return apiserverapp.Run(compCtx, completed) })

	if err := writeKubeconfig(cfg.kubeconfig, server, p, "admin"); err != nil {
		return err
	}
	if err := waitReady(ctx, cfg.kubeconfig, errCh); err != nil {
		cancelComponents()
		return err
	}
	apiReady := time.Since(start)

	// kube-controller-manager: controllers use their own service accounts, like kubeadm sets it up.
	kcmOpts, err := kcmoptions.NewKubeControllerManagerOptions()
	if err != nil {
		return err
	}
	kcmFS := pflag.NewFlagSet("kube-controller-manager", pflag.ContinueOnError)
	kcmNamed := kcmOpts.Flags(kcmapp.KnownControllers(), kcmapp.ControllersDisabledByDefault(), kcmapp.ControllerAliases())
	for _, f := range kcmNamed.FlagSets {
		kcmFS.AddFlagSet(f)
	}
	if err := kcmFS.Parse([]string{
		"--kubeconfig=" + kcmKubeconfig,
		"--secure-port=0",
		"--leader-elect=false",
		"--use-service-account-credentials=true",
		"--controllers=" + cfg.controllers,
		"--service-account-private-key-file=" + p.file("sa.key"),
		"--root-ca-file=" + p.file("ca.crt"),
		"--cluster-name=testcluster",
		"--node-monitor-grace-period=" + cfg.nodeMonitorGrace.String(),
		"--profiling=false",
	}); err != nil {
		return fmt.Errorf("kube-controller-manager flags: %w", err)
	}
	kcmConfig, err := kcmOpts.Config(compCtx, kcmapp.KnownControllers(), kcmapp.ControllersDisabledByDefault(), kcmapp.ControllerAliases())
	if err != nil {
		return fmt.Errorf("kube-controller-manager: %w", err)
	}
	goRun("kube-controller-manager", func() error { return kcmapp.Run(compCtx, kcmConfig.Complete()) })

	schedOpts := schedoptions.NewOptions()
	schedFS := pflag.NewFlagSet("kube-scheduler", pflag.ContinueOnError)
	for _, f := range schedOpts.Flags.FlagSets {
		schedFS.AddFlagSet(f)
	}
	if err := schedFS.Parse([]string{
		"--kubeconfig=" + schedKubeconfig,
		"--secure-port=0",
		"--leader-elect=false",
		"--profiling=false",
	}); err != nil {
		return fmt.Errorf("kube-scheduler flags: %w", err)
	}
	schedConfig, sched, err := schedapp.Setup(compCtx, schedOpts)
	if err != nil {
		return fmt.Errorf("kube-scheduler: %w", err)
	}
	goRun("kube-scheduler", func() error { return schedapp.Run(compCtx, schedConfig, sched) })

	fmt.Printf("testcluster: ready server=%s kubeconfig=%s apiserver-ready=%s\n",
		server, cfg.kubeconfig, apiReady.Round(time.Millisecond))

	var runErr error
	select {
	case <-ctx.Done():
	case runErr = <-errCh:
	}
	fmt.Println("testcluster: stopping")
	cancelComponents()
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(15 * time.Second):
		fmt.Fprintln(os.Stderr, "testcluster: components did not stop within 15s")
	}
	klog.Flush()
	return runErr // the deferred etcd.Close runs next
}

// watchParent returns a context cancelled when the parent process exits (we get re-parented).
func watchParent(ctx context.Context) context.Context {
	ctx, cancel := context.WithCancel(ctx)
	parent := os.Getppid()
	go func() {
		t := time.NewTicker(500 * time.Millisecond)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
				if os.Getppid() != parent {
					cancel()
					return
				}
			}
		}
	}()
	return ctx
}

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// startEtcd starts etcd on the given ports (0: a free one); its client URL and ports.
func startEtcd(dir string, clientPort, peerPort int) (*embed.Etcd, string, int, int, error) {
	var err error
	if clientPort == 0 {
		if clientPort, err = freePort(); err != nil {
			return nil, "", 0, 0, err
		}
	}
	if peerPort == 0 {
		if peerPort, err = freePort(); err != nil {
			return nil, "", 0, 0, err
		}
	}
	clientURL := url.URL{Scheme: "http", Host: fmt.Sprintf("127.0.0.1:%d", clientPort)}
	peerURL := url.URL{Scheme: "http", Host: fmt.Sprintf("127.0.0.1:%d", peerPort)}
	c := embed.NewConfig()
	c.Name = "testcluster"
	c.Dir = dir
	c.ListenClientUrls = []url.URL{clientURL}
	c.AdvertiseClientUrls = []url.URL{clientURL}
	c.ListenPeerUrls = []url.URL{peerURL}
	c.AdvertisePeerUrls = []url.URL{peerURL}
	c.InitialCluster = c.InitialClusterFromName(c.Name)
	c.LogLevel = "error"
	// Disposable data: trade durability for speed. A killed process (--keep-state continues
	// after one) loses nothing: its writes are in the page cache; only a machine crash would.
	c.UnsafeNoFsync = true
	c.QuotaBackendBytes = 2 << 30
	e, err := embed.StartEtcd(c)
	if err != nil {
		return nil, "", 0, 0, err
	}
	select {
	case <-e.Server.ReadyNotify():
	case err := <-e.Err():
		e.Close()
		return nil, "", 0, 0, err
	case <-time.After(60 * time.Second):
		e.Close()
		return nil, "", 0, 0, errors.New("etcd did not become ready within 60s")
	}
	return e, clientURL.String(), clientPort, peerPort, nil
}

func waitReady(ctx context.Context, kubeconfig string, errCh <-chan error) error {
	restConfig, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
	if err != nil {
		return err
	}
	client, err := kubernetes.NewForConfig(restConfig)
	if err != nil {
		return err
	}
	deadline := time.After(120 * time.Second)
	for {
		result := client.Discovery().RESTClient().Get().AbsPath("/readyz").Do(ctx)
		var code int
		result.StatusCode(&code)
		if code == 200 {
			return nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case err := <-errCh:
			return err
		case <-deadline:
			return errors.New("kube-apiserver not ready within 120s")
		case <-time.After(100 * time.Millisecond):
		}
	}
}

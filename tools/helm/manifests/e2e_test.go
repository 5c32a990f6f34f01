package manifests

import (
	"bufio"
	"bytes"
	"context"
	"database/sql"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/emersion/go-smtp"
	_ "github.com/jackc/pgx/v5/stdlib"
	"github.com/nats-io/nats-server/v2/server"
	collectortrace "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	"google.golang.org/grpc"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
)

// demoGoals are the five goals of the built-in demo playbooks.
var demoGoals = []string{
	"How many open support tickets does Acme Corp have?",
	"Compare revenue and open tickets for Acme Corp and Globex",
	"What is the average order value by region in 2025?",
	"Send the runbook for failed payment retries to oncall@example.com",
	"Email the account team a summary of the top 5 customers by revenue in 2025",
}

// TestDevOverlayEndToEnd starts the planex processes with exactly the
// environment, arguments and mounted files the rendered dev overlay plus
// components/mcp-pool gives their containers (init containers first), with
// the in-cluster names mapped to loopback: NATS to a 3-node JetStream
// cluster, postgres to the machine's PostgreSQL (a fresh schema), mailpit
// to an SMTP sink, jaeger to an OTLP receiver, the mcp pool's example
// server tickets-mcp to an MCP server requiring its bearer token. Every
// credential comes from `planex auth k8s-secrets --pools ...,mcp`. Then
// it checks the mcp pool's tools reached the supervisor's catalog (over
// NATS with its own nkey, TLS and permissions), runs the five demo goals
// and checks each succeeds, that mail reached the sink and that every
// service exported spans.
func TestDevOverlayEndToEnd(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: skipping the dev overlay end-to-end test (builds planex, starts 3 NATS servers and 5 processes)")
	}
	baseDSN := os.Getenv("PLANEX_TEST_POSTGRES_DSN")
	if baseDSN == "" {
		t.Skip("PLANEX_TEST_POSTGRES_DSN not set: the dev overlay's sql pool needs PostgreSQL (postgres://postgres@127.0.0.1:5432/test?sslmode=disable on the CI machines)")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	defer cancel()

	out, err := k8sFS(t).BuildCombination(Combination{Overlay: "dev", Components: []string{"mcp-pool"}})
	if err != nil {
		t.Fatal(err)
	}
	r := decode(t, "dev+mcp-pool", out, "planex", true)

	bin := buildPlanex(t)
	// The Secrets an operator creates with `planex auth k8s-secrets`: the
	// processes get their mounted files, NATS its TLS and authorization.
	credDir := t.TempDir()
	gen := exec.CommandContext(ctx, bin, "auth", "k8s-secrets", "--namespace", "planex", "--pools", "sql,email,search,mcp", "--out-dir", credDir)
	secretYAML, err := gen.Output()
	if err != nil {
		t.Fatalf("planex auth k8s-secrets: %v", err)
	}
	secrets, err := Decode(secretYAML, "planex")
	if err != nil {
		t.Fatalf("decode the generated Secrets: %v", err)
	}
	r.Objects = append(r.Objects, secrets...)
	// The mcp pool's own Secret, as `kubectl create secret generic
	// planex-mcp --from-literal=MCP_TOKEN=...` makes it.
	mcpToken := fmt.Sprintf("mcp-token-%d", time.Now().UnixNano())
	r.Objects = append(r.Objects, Object{Kind: "Secret", Name: "planex-mcp", Namespace: "planex",
		Obj: &corev1.Secret{Data: map[string][]byte{"MCP_TOKEN": []byte(mcpToken)}}})
	mcpServer := startMCPSink(t, mcpToken)
	natsURLs := startNATSCluster(t, natsSecurity(t, r))
	dsn := freshSchema(t, baseDSN)
	sink := startSMTPSink(t)
	otlp := startOTLPReceiver(t)

	addrs := map[string]string{} // Service host:port -> loopback address
	for _, o := range r.Objects {
		svc, ok := o.Obj.(*corev1.Service)
		if !ok || svc.Spec.ClusterIP == "None" {
			continue
		}
		for _, p := range svc.Spec.Ports {
			addrs[fmt.Sprintf("%s:%d", svc.Name, p.Port)] = "" // filled below
		}
	}
	addrs["nats:4222"] = natsURLs[0] // per process below, like the Service spreading clients
	addrs["mailpit:1025"] = sink.addr
	addrs["jaeger:4317"] = otlp.addr
	addrs["tickets-mcp.tools.svc:8080"] = mcpServer.addr

	// Each planex Deployment gets loopback ports for its gRPC and metrics
	// listeners; its Service name maps to the gRPC one.
	type proc struct {
		name   string
		w      Workload
		grpc   string
		health string // the plaintext health listener the kubelet probes
		exited <-chan struct{}
	}
	var procs []proc
	for _, w := range r.Workloads() {
		if w.Template.Labels["planex.dev/service"] != "true" {
			continue
		}
		p := proc{name: w.Name, w: w, grpc: freeAddr(t), health: freeAddr(t)}
		addrs[w.Name+":"+strconv.Itoa(int(w.Template.Spec.Containers[0].Ports[0].ContainerPort))] = p.grpc
		procs = append(procs, p)
	}
	if len(procs) != 6 {
		t.Fatalf("dev overlay with the mcp pool has %d planex services, want 6", len(procs))
	}
	// Start order: planner and pools before the supervisor, as Kubernetes
	// would converge to anyway.
	slices.SortFunc(procs, func(a, b proc) int {
		return boolInt(a.name == "planex-supervisor") - boolInt(b.name == "planex-supervisor")
	})

	for i, p := range procs {
		// The NATS Service spreads clients over the nodes: so does the test
		// (--nats-url takes one URL; the client learns the others).
		natsURL := natsURLs[i%len(natsURLs)]
		spec := p.w.Template.Spec
		dirs := map[string]string{} // mountPath -> temp dir
		for _, c := range slices.Concat(spec.InitContainers, spec.Containers) {
			for _, vm := range c.VolumeMounts {
				if _, ok := dirs[vm.MountPath]; !ok {
					dirs[vm.MountPath] = t.TempDir()
					writeSecretVolume(t, r, spec, vm, dirs[vm.MountPath])
				}
			}
		}
		mapValue := func(name, v string) string {
			if strings.HasPrefix(v, "postgres://") {
				return dsn
			}
			if strings.HasPrefix(name, "PLANEX_") && strings.HasSuffix(name, "_ADDR") && strings.HasPrefix(v, ":") {
				switch name {
				case "PLANEX_GRPC_ADDR":
					return p.grpc
				case "PLANEX_HEALTH_ADDR":
					return p.health
				}
				return "127.0.0.1:0"
			}
			for from, to := range addrs {
				if to != "" && strings.Contains(v, from) {
					if strings.HasPrefix(v, "nats://") || strings.HasPrefix(v, "tls://") {
						return natsURL
					}
					v = strings.ReplaceAll(v, from, strings.TrimPrefix(to, "http://"))
				}
			}
			// The longest mount holding the path, once (a temp dir itself
			// lies under /tmp, another mount).
			best := ""
			for mount := range dirs {
				if (v == mount || strings.HasPrefix(v, strings.TrimSuffix(mount, "/")+"/")) && len(mount) > len(best) {
					best = mount
				}
			}
			if best != "" {
				v = dirs[best] + strings.TrimPrefix(v, best)
			}
			return v
		}
		// ConfigMap volumes (the mcp pool's mcp.json) with the same
		// address mapping as the environment.
		for _, c := range slices.Concat(spec.InitContainers, spec.Containers) {
			for _, vm := range c.VolumeMounts {
				for _, v := range spec.Volumes {
					if v.Name != vm.Name || v.ConfigMap == nil {
						continue
					}
					cm, _ := r.Find("ConfigMap", v.ConfigMap.Name).(*corev1.ConfigMap)
					if cm == nil {
						t.Fatalf("%s: volume %s: ConfigMap %s not in the dev render", p.name, v.Name, v.ConfigMap.Name)
					}
					for key, data := range cm.Data {
						data = mapValue("", data)
						if m := inCluster.FindString(data); m != "" {
							t.Fatalf("%s: ConfigMap %s key %s still names the in-cluster address %s", p.name, cm.Name, key, m)
						}
						if err := os.WriteFile(filepath.Join(dirs[vm.MountPath], key), []byte(data), 0o600); err != nil {
							t.Fatal(err)
						}
					}
				}
			}
		}
		for _, c := range spec.InitContainers {
			env := containerEnv(t, r, c, mapValue)
			cmd := exec.CommandContext(ctx, bin, mapArgs(expandArgs(c.Args, env), mapValue)...)
			cmd.Env = envList(env)
			if out, err := cmd.CombinedOutput(); err != nil {
				t.Fatalf("%s init container %s: %v\n%s", p.name, c.Name, err, out)
			} else {
				t.Logf("%s init container %s: %s", p.name, c.Name, bytes.TrimSpace(out))
			}
		}
		c := spec.Containers[0]
		env := containerEnv(t, r, c, mapValue)
		for k, v := range env {
			if m := inCluster.FindString(v); m != "" {
				t.Fatalf("%s: %s=%q still names the in-cluster address %s", p.name, k, v, m)
			}
		}
		procs[i].exited = startProcess(t, p.name, bin, mapArgs(expandArgs(c.Args, env), mapValue), env)
	}
	// Serving as the kubelet's gRPC probe sees it: the plaintext health port.
	var mcpHealth string
	for _, p := range procs {
		waitServing(ctx, t, bin, p.name, p.health, p.exited)
		if p.name == "planex-executor-mcp" {
			mcpHealth = p.health
		}
	}

	supervisor := addrs["planex-supervisor:7400"]
	// The mcp pool: its session with the MCP server is up (bearer token
	// from the Secret), and its tool reached the supervisor's catalog.
	if out, err := exec.CommandContext(ctx, bin, "health", "--plaintext", "--addr", mcpHealth, "--service", "planex.mcp.tickets").CombinedOutput(); err != nil {
		t.Fatalf("mcp pool: MCP server tickets not SERVING: %v %s", err, out)
	}
	if authorized, unauthorized, listed := mcpServer.counts(); authorized == 0 || unauthorized != 0 || listed == 0 {
		t.Fatalf("MCP server: %d authorized requests, %d without the token, %d tools/list; want the pool's token on every request", authorized, unauthorized, listed)
	}
	waitCatalog(ctx, t, bin, supervisor, credDir, "mcp", "mcp.tickets_close_ticket")
	for _, goal := range demoGoals {
		t.Run(goal, func(t *testing.T) {
			gctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
			defer cancel()
			// Over TLS with the admin API key, as an operator after
			// `kubectl port-forward` (the certificate names 127.0.0.1).
			cmd := exec.CommandContext(gctx, bin, "run", "--addr", supervisor, "--tls-ca-file", filepath.Join(credDir, "ca.crt"),
				"--token-file", filepath.Join(credDir, "admin.token"), goal)
			out, err := cmd.CombinedOutput()
			if err != nil {
				t.Fatalf("planex run %q: %v\n%s", goal, err, out)
			}
			t.Logf("%s\n%s", goal, lastLines(string(out), 4))
		})
	}
	if got := sink.recipients(); !slices.Contains(got, "oncall@example.com") || !slices.Contains(got, "account-team@example.com") {
		t.Errorf("SMTP sink received mail for %v; want oncall@example.com and account-team@example.com", got)
	}
	// Spans are exported in batches: poll until every service has sent some.
	deadline := time.Now().Add(30 * time.Second)
	for {
		missing := otlp.missing([]string{"planex-supervisor", "planex-planner", "planex-executor-sql", "planex-executor-email", "planex-executor-search"})
		if len(missing) == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Errorf("no spans received from %v", missing)
			break
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// inCluster matches the in-cluster Service names of the dev overlay and
// the mcp pool's example MCP server.
var inCluster = regexp.MustCompile(`\b(nats|planex-planner|planex-supervisor|postgres|mailpit|jaeger|tickets-mcp)(\.[a-z.-]+)?:\d+`)

// waitCatalog polls `planex tools --pool POOL` on the supervisor (over TLS
// with the admin key) until it lists tool with approval required.
func waitCatalog(ctx context.Context, t *testing.T, bin, supervisor, credDir, pool, tool string) {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for {
		out, err := exec.CommandContext(ctx, bin, "tools", "--addr", supervisor, "--tls-ca-file", filepath.Join(credDir, "ca.crt"),
			"--token-file", filepath.Join(credDir, "admin.token"), "--pool", pool).CombinedOutput()
		if err == nil {
			for _, line := range strings.Split(string(out), "\n") {
				if f := strings.Fields(line); len(f) >= 4 && f[0] == tool && f[1] == pool && f[3] == "true" {
					return
				}
			}
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			t.Fatalf("supervisor's catalog has no %s of pool %s with approval required: %v\n%s", tool, pool, err, out)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

func boolInt(b bool) int {
	if b {
		return 1
	}
	return 0
}

// containerEnv resolves a container's environment as the kubelet would:
// envFrom ConfigMaps and Secrets first, then env (values, ConfigMap and
// Secret keys from the render), then maps each value to loopback.
func containerEnv(t *testing.T, r Render, c corev1.Container, mapValue func(name, v string) string) map[string]string {
	t.Helper()
	env := map[string]string{}
	lookup := func(kind, name, key string, optional bool) (string, bool) {
		switch o := r.Find(kind, name).(type) {
		case *corev1.ConfigMap:
			v, ok := o.Data[key]
			return v, ok
		case *corev1.Secret:
			if v, ok := o.StringData[key]; ok {
				return v, true
			}
			v, ok := o.Data[key]
			return string(v), ok
		}
		if !optional {
			t.Fatalf("container %s: %s %s not in the dev render", c.Name, kind, name)
		}
		return "", false
	}
	for _, ef := range c.EnvFrom {
		switch {
		case ef.ConfigMapRef != nil:
			cm, _ := r.Find("ConfigMap", ef.ConfigMapRef.Name).(*corev1.ConfigMap)
			if cm == nil {
				t.Fatalf("container %s: ConfigMap %s not in the dev render", c.Name, ef.ConfigMapRef.Name)
			}
			for k, v := range cm.Data {
				env[ef.Prefix+k] = v
			}
		case ef.SecretRef != nil:
			s, _ := r.Find("Secret", ef.SecretRef.Name).(*corev1.Secret)
			if s == nil {
				t.Fatalf("container %s: Secret %s not in the dev render", c.Name, ef.SecretRef.Name)
			}
			for k, v := range s.Data {
				env[ef.Prefix+k] = string(v)
			}
		}
	}
	for _, e := range c.Env {
		switch {
		case e.ValueFrom == nil:
			env[e.Name] = e.Value
		case e.ValueFrom.ConfigMapKeyRef != nil:
			ref := e.ValueFrom.ConfigMapKeyRef
			if v, ok := lookup("ConfigMap", ref.Name, ref.Key, ref.Optional != nil && *ref.Optional); ok {
				env[e.Name] = v
			}
		case e.ValueFrom.SecretKeyRef != nil:
			ref := e.ValueFrom.SecretKeyRef
			if v, ok := lookup("Secret", ref.Name, ref.Key, ref.Optional != nil && *ref.Optional); ok {
				env[e.Name] = v
			}
		default:
			t.Fatalf("container %s: %s: unsupported valueFrom", c.Name, e.Name)
		}
	}
	for k, v := range env {
		env[k] = mapValue(k, v)
	}
	return env
}

// expandArgs expands $(VAR) in args from env, as Kubernetes does.
func expandArgs(args []string, env map[string]string) []string {
	re := regexp.MustCompile(`\$\(([A-Za-z_][A-Za-z0-9_]*)\)`)
	out := make([]string, len(args))
	for i, a := range args {
		out[i] = re.ReplaceAllStringFunc(a, func(m string) string {
			if v, ok := env[m[2:len(m)-1]]; ok {
				return v
			}
			return m
		})
	}
	return out
}

// mapArgs maps addresses and mount paths in args, as in the environment.
func mapArgs(args []string, mapValue func(name, v string) string) []string {
	out := make([]string, len(args))
	for i, a := range args {
		if k, v, ok := strings.Cut(a, "="); ok && strings.HasPrefix(k, "--") {
			out[i] = k + "=" + mapValue("", v)
		} else {
			out[i] = mapValue("", a)
		}
	}
	return out
}

func envList(env map[string]string) []string {
	// Only what the container gets, plus PATH-free basics: no host
	// PLANEX_* or OTEL_* variable leaks in.
	list := []string{"HOME=" + os.TempDir()}
	for k, v := range env {
		list = append(list, k+"="+v)
	}
	slices.Sort(list)
	return list
}

// buildPlanex returns $PLANEX_BINARY (CI points it at the release binary
// it just built with `make binary-linux`), or builds ./cmd/planex.
func buildPlanex(t *testing.T) string {
	t.Helper()
	if bin := os.Getenv("PLANEX_BINARY"); bin != "" {
		abs, err := filepath.Abs(bin)
		if err != nil {
			t.Fatal(err)
		}
		return abs
	}
	bin := filepath.Join(t.TempDir(), "planex")
	cmd := exec.Command("go", "build", "-o", bin, "./cmd/planex")
	cmd.Dir = repoRoot(t)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go build ./cmd/planex: %v\n%s", err, out)
	}
	return bin
}

// handedOut are the ports freeAddr returned or found taken: two
// processes of the test must not be told to bind the same one.
var handedOut sync.Map

// freeAddr returns a loopback address nobody listened on a moment ago,
// below the kernel's ephemeral range (internal/freeport's rule; this
// module does not import the planex module). A port from the range —
// what listening on port 0 gives — can be taken by another process's
// listener on port 0 before the process told to use it binds it: a
// CI run failed so, the mcp pool's metrics listener (on port 0) taking
// the port handed out for its health listener.
func freeAddr(t *testing.T) string {
	t.Helper()
	start := 32768
	if b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range"); err == nil {
		if f := strings.Fields(string(b)); len(f) == 2 {
			if n, err := strconv.Atoi(f[0]); err == nil && n > 1024 {
				start = n
			}
		}
	}
	base := max(start-12000, 1024)
	for range 1000 {
		port := base + rand.IntN(start-base)
		if _, dup := handedOut.LoadOrStore(port, true); dup {
			continue
		}
		l, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(port)))
		if err != nil {
			continue
		}
		l.Close()
		return l.Addr().String()
	}
	t.Fatalf("no free loopback port in %d-%d", base, start-1)
	return ""
}

// writeSecretVolume writes the files of a Secret volume (all keys, or its
// items) into dir, as the kubelet mounts them.
func writeSecretVolume(t *testing.T, r Render, spec corev1.PodSpec, vm corev1.VolumeMount, dir string) {
	t.Helper()
	for _, v := range spec.Volumes {
		if v.Name != vm.Name || v.Secret == nil {
			continue
		}
		s, _ := r.Find("Secret", v.Secret.SecretName).(*corev1.Secret)
		if s == nil {
			if v.Secret.Optional != nil && *v.Secret.Optional {
				return
			}
			t.Fatalf("volume %s: Secret %s neither in the dev render nor generated by planex auth k8s-secrets", v.Name, v.Secret.SecretName)
		}
		files := map[string]string{}
		for k := range s.Data {
			files[k] = k
		}
		if len(v.Secret.Items) > 0 {
			files = map[string]string{}
			for _, it := range v.Secret.Items {
				files[it.Key] = it.Path
			}
		}
		for key, path := range files {
			if err := os.MkdirAll(filepath.Dir(filepath.Join(dir, path)), 0o700); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(filepath.Join(dir, path), s.Data[key], 0o600); err != nil {
				t.Fatal(err)
			}
		}
	}
}

// natsSecurity returns the rendered NATS server's client TLS and nkey
// users: the nats.conf of the render (its tls block and the include of
// the authorization block) loaded by nats-server with the Secret files in
// place of the mounts.
func natsSecurity(t *testing.T, r Render) *server.Options {
	t.Helper()
	var sts *appsv1.StatefulSet
	for _, o := range r.Objects {
		if v, ok := o.Obj.(*appsv1.StatefulSet); ok && o.Name == "nats" {
			sts = v
		}
	}
	if sts == nil {
		t.Fatal("dev render has no StatefulSet nats")
	}
	spec := sts.Spec.Template.Spec
	root := t.TempDir()
	var conf string
	for _, vm := range spec.Containers[0].VolumeMounts {
		dir := filepath.Join(root, vm.MountPath)
		if err := os.MkdirAll(dir, 0o700); err != nil {
			t.Fatal(err)
		}
		writeSecretVolume(t, r, spec, vm, dir)
		for _, v := range spec.Volumes {
			if v.Name == vm.Name && v.ConfigMap != nil {
				cm, _ := r.Find("ConfigMap", v.ConfigMap.Name).(*corev1.ConfigMap)
				if cm == nil {
					t.Fatalf("ConfigMap %s not in the dev render", v.ConfigMap.Name)
				}
				conf = filepath.Join(dir, "nats.conf")
				// Absolute paths point into the mounts.
				data := strings.ReplaceAll(cm.Data["nats.conf"], "/etc/", root+"/etc/")
				if err := os.WriteFile(conf, []byte(data), 0o600); err != nil {
					t.Fatal(err)
				}
			}
		}
	}
	if conf == "" {
		t.Fatal("StatefulSet nats mounts no nats.conf")
	}
	t.Setenv("SERVER_NAME", "nats-0")
	opts, err := server.ProcessConfigFile(conf)
	if err != nil {
		t.Fatalf("nats-server rejects the rendered nats.conf with the generated Secrets: %v", err)
	}
	if opts.TLSConfig == nil || len(opts.Nkeys) == 0 {
		t.Fatalf("rendered nats.conf: TLS %v, %d nkey users; want TLS and the planex users", opts.TLSConfig != nil, len(opts.Nkeys))
	}
	return opts
}

// startNATSCluster starts a 3-node JetStream cluster in process with the
// client TLS and users of sec and returns the client URLs once it has a
// meta leader.
func startNATSCluster(t *testing.T, sec *server.Options) []string {
	t.Helper()
	const n = 3
	var routes []*url.URL
	clusterAddrs := make([]string, n)
	for i := range n {
		clusterAddrs[i] = freeAddr(t)
		routes = append(routes, &url.URL{Scheme: "nats", Host: clusterAddrs[i]})
	}
	var urls []string
	var servers []*server.Server
	for i := range n {
		host, port, _ := net.SplitHostPort(clusterAddrs[i])
		cport, _ := strconv.Atoi(port)
		opts := &server.Options{
			ServerName: fmt.Sprintf("nats-%d", i),
			Host:       "127.0.0.1",
			Port:       -1,
			JetStream:  true,
			StoreDir:   t.TempDir(),
			NoSigs:     true,
			Cluster:    server.ClusterOpts{Name: "planex", Host: host, Port: cport},
			Routes:     routes,
			TLSConfig:  sec.TLSConfig,
			TLSTimeout: sec.TLSTimeout,
			TLS:        true,
			Nkeys:      sec.Nkeys,
		}
		s, err := server.NewServer(opts)
		if err != nil {
			t.Fatalf("nats server %d: %v", i, err)
		}
		go s.Start()
		t.Cleanup(s.Shutdown)
		servers = append(servers, s)
	}
	for _, s := range servers {
		if !s.ReadyForConnections(20 * time.Second) {
			t.Fatalf("nats server %s not ready", s.Name())
		}
		urls = append(urls, strings.Replace(s.ClientURL(), "nats://", "tls://", 1))
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		leader := false
		for _, s := range servers {
			if s.JetStreamIsLeader() {
				leader = true
			}
		}
		if leader && servers[0].NumRoutes() >= n-1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("JetStream cluster has no meta leader after 30s")
		}
		time.Sleep(100 * time.Millisecond)
	}
	return urls
}

// freshSchema creates a schema in the test database and returns a DSN
// whose search_path is that schema, so `planex demo seed` finds it empty.
func freshSchema(t *testing.T, base string) string {
	t.Helper()
	db, err := sql.Open("pgx", base)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	name := fmt.Sprintf("planex_e2e_%d", time.Now().UnixNano())
	if _, err := db.Exec(`CREATE SCHEMA ` + name); err != nil {
		t.Fatalf("create schema: %v", err)
	}
	t.Cleanup(func() {
		db, err := sql.Open("pgx", base)
		if err == nil {
			db.Exec(`DROP SCHEMA ` + name + ` CASCADE`)
			db.Close()
		}
	})
	sep := "?"
	if strings.Contains(base, "?") {
		sep = "&"
	}
	return base + sep + "search_path=" + name
}

// startProcess runs one planex process until the test ends; its output
// goes to the test log when the test fails. The channel is closed when
// the process exits.
func startProcess(t *testing.T, name, bin string, args []string, env map[string]string) <-chan struct{} {
	t.Helper()
	cmd := exec.Command(bin, args...)
	cmd.Env = envList(env)
	var out syncBuffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		t.Fatalf("start %s: %v", name, err)
	}
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); close(done) }()
	t.Cleanup(func() {
		_ = cmd.Process.Signal(os.Interrupt)
		select {
		case <-done:
		case <-time.After(20 * time.Second):
			_ = cmd.Process.Kill()
			<-done
		}
		if t.Failed() {
			t.Logf("--- %s %v output:\n%s", name, args, lastLines(out.String(), 40))
		}
	})
	return done
}

// waitServing polls `planex health` until the service reports SERVING;
// it fails at once when the process has exited (a start-up error, such as
// a credential missing from the mounts).
func waitServing(ctx context.Context, t *testing.T, bin, name, addr string, exited <-chan struct{}) {
	t.Helper()
	deadline := time.Now().Add(2 * time.Minute)
	for {
		select {
		case <-exited:
			t.Fatalf("%s exited before it was SERVING (its output is logged below)", name)
		default:
		}
		out, err := exec.CommandContext(ctx, bin, "health", "--plaintext", "--addr", addr, "--timeout", "2s").CombinedOutput()
		if err == nil {
			return
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			t.Fatalf("%s at %s not SERVING: %v %s", name, addr, err, out)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

func lastLines(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// smtpSink is a real SMTP server (no TLS, no AUTH, like Mailpit) that
// records the recipients of every message.
type smtpSink struct {
	addr string
	mu   sync.Mutex
	rcpt []string
}

func (s *smtpSink) recipients() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.rcpt)
}

func (s *smtpSink) NewSession(*smtp.Conn) (smtp.Session, error) { return &sinkSession{sink: s}, nil }

type sinkSession struct {
	sink *smtpSink
	to   []string
}

func (s *sinkSession) Mail(string, *smtp.MailOptions) error { return nil }
func (s *sinkSession) Rcpt(to string, _ *smtp.RcptOptions) error {
	s.to = append(s.to, to)
	return nil
}
func (s *sinkSession) Data(r io.Reader) error {
	if _, err := io.Copy(io.Discard, bufio.NewReader(r)); err != nil {
		return err
	}
	s.sink.mu.Lock()
	s.sink.rcpt = append(s.sink.rcpt, s.to...)
	s.sink.mu.Unlock()
	return nil
}
func (s *sinkSession) Reset()        { s.to = nil }
func (s *sinkSession) Logout() error { return nil }

func startSMTPSink(t *testing.T) *smtpSink {
	t.Helper()
	sink := &smtpSink{}
	srv := smtp.NewServer(sink)
	srv.Domain = "mailpit.test"
	srv.AllowInsecureAuth = true
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	sink.addr = l.Addr().String()
	go func() { _ = srv.Serve(l) }()
	t.Cleanup(func() { _ = srv.Close() })
	return sink
}

// otlpReceiver is an OTLP/gRPC trace receiver (what Jaeger runs on 4317)
// that records which services exported spans.
type otlpReceiver struct {
	collectortrace.UnimplementedTraceServiceServer
	addr     string
	mu       sync.Mutex
	services map[string]int
}

func (o *otlpReceiver) Export(_ context.Context, req *collectortrace.ExportTraceServiceRequest) (*collectortrace.ExportTraceServiceResponse, error) {
	o.mu.Lock()
	defer o.mu.Unlock()
	for _, rs := range req.GetResourceSpans() {
		for _, a := range rs.GetResource().GetAttributes() {
			if a.GetKey() == "service.name" {
				for _, ss := range rs.GetScopeSpans() {
					o.services[a.GetValue().GetStringValue()] += len(ss.GetSpans())
				}
			}
		}
	}
	return &collectortrace.ExportTraceServiceResponse{}, nil
}

func (o *otlpReceiver) missing(names []string) []string {
	o.mu.Lock()
	defer o.mu.Unlock()
	var m []string
	for _, n := range names {
		if o.services[n] == 0 {
			m = append(m, n)
		}
	}
	return m
}

func startOTLPReceiver(t *testing.T) *otlpReceiver {
	t.Helper()
	o := &otlpReceiver{services: map[string]int{}}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	o.addr = "http://" + l.Addr().String()
	srv := grpc.NewServer()
	collectortrace.RegisterTraceServiceServer(srv, o)
	go func() { _ = srv.Serve(l) }()
	t.Cleanup(srv.Stop)
	return o
}

package main

import (
	"bufio"
	"context"
	"database/sql"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/go-sql-driver/mysql"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// proc is one child process the soak starts, and may kill and restart
// with the same arguments; its output goes to <dir>/<name>.log (appended
// across restarts).
type proc struct {
	name    string
	bin     string
	args    []string
	logPath string
	// status is its status address (/metrics), "" for mariadbd.
	status string

	cmd  *exec.Cmd
	done chan struct{}
	err  error
	// restarts counts the starts after the first.
	restarts int
}

func (p *proc) start() error {
	logf, err := os.OpenFile(p.logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	cmd := exec.Command(p.bin, p.args...)
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := cmd.Start(); err != nil {
		logf.Close()
		return fmt.Errorf("start %s: %w", p.name, err)
	}
	if p.cmd != nil {
		p.restarts++
	}
	p.cmd, p.done, p.err = cmd, make(chan struct{}), nil
	done := p.done
	go func() {
		p.err = cmd.Wait()
		logf.Close()
		close(done)
	}()
	return nil
}

func (p *proc) pid() int { return p.cmd.Process.Pid }

func (p *proc) exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// stop sends sig and waits for the exit, then SIGKILL after grace.
func (p *proc) stop(sig syscall.Signal, grace time.Duration) {
	if p.cmd == nil || p.exited() {
		return
	}
	_ = p.cmd.Process.Signal(sig)
	select {
	case <-p.done:
	case <-time.After(grace):
		_ = p.cmd.Process.Kill()
		<-p.done
	}
}

// system is everything the soak runs: a private mariadbd, three rgserver
// replicas (each embedding one etcd member) and three rgproxies.
type system struct {
	dir      string
	maria    *proc
	mariaAdr string
	rgs      []*proc
	rgsAddr  []string
	rgsPeer  []string
	pxs      []*proc
	pxAddr   []string
}

// freeAddr returns a loopback address nothing listens on now, never the
// same twice.
func (s *system) freeAddr(used map[string]bool) (string, error) {
	for {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return "", err
		}
		addr := ln.Addr().String()
		ln.Close()
		if !used[addr] {
			used[addr] = true
			return addr, nil
		}
	}
}

func startSystem(ctx context.Context, cfg config, logf func(string, ...any)) (*system, error) {
	dir, err := os.MkdirTemp("", "rgproxy-soak")
	if err != nil {
		return nil, err
	}
	s := &system{dir: dir}
	used := map[string]bool{}
	var addrErr error
	addr := func() string {
		a, err := s.freeAddr(used)
		if err != nil && addrErr == nil {
			addrErr = err
		}
		return a
	}

	// The private MariaDB: killing and restarting it hurts nobody.
	for _, tool := range []string{"mariadb-install-db", mariadbdPath()} {
		if _, lerr := exec.LookPath(tool); lerr != nil {
			return s, fmt.Errorf("%s not found (apt-get install mariadb-server; `make test-deps` installs it): %w", tool, lerr)
		}
	}
	data := filepath.Join(dir, "mariadb")
	install := exec.CommandContext(ctx, "mariadb-install-db", "--no-defaults", "--datadir="+data, "--user=root",
		"--auth-root-authentication-method=normal", "--skip-test-db")
	if out, ierr := install.CombinedOutput(); ierr != nil {
		return s, fmt.Errorf("mariadb-install-db: %w\n%s", ierr, out)
	}
	s.mariaAdr = addr()
	_, port, _ := net.SplitHostPort(s.mariaAdr)
	s.maria = &proc{name: "mariadbd", bin: mariadbdPath(), logPath: filepath.Join(dir, "mariadbd.log"), args: []string{
		"--no-defaults", "--datadir=" + data, "--user=root", "--bind-address=127.0.0.1", "--port=" + port,
		"--socket=" + filepath.Join(dir, "mysqld.sock"), "--pid-file=" + filepath.Join(dir, "mysqld.pid"),
		"--skip-log-bin", "--innodb-buffer-pool-size=64M", "--innodb-log-file-size=32M", "--max-connections=1000",
		// Sessions idle this long are closed by the server: rgproxy must
		// close their clients at once so that pools replace them.
		fmt.Sprintf("--wait-timeout=%d", cfg.WaitTimeout), fmt.Sprintf("--interactive-timeout=%d", cfg.WaitTimeout),
	}}
	if err := s.maria.start(); err != nil {
		return s, err
	}
	if err := s.waitMaria(60 * time.Second); err != nil {
		return s, err
	}
	logf("mariadbd %s ready (wait_timeout %ds)", s.mariaAdr, cfg.WaitTimeout)

	// Three rgservers, one etcd member each.
	names := []string{"rgs1", "rgs2", "rgs3"}
	var cluster []string
	status := make([]string, len(names))
	for i, n := range names {
		s.rgsAddr = append(s.rgsAddr, addr())
		status[i] = addr()
		s.rgsPeer = append(s.rgsPeer, "http://"+addr())
		cluster = append(cluster, n+"="+s.rgsPeer[i])
	}
	for i, n := range names {
		p := &proc{name: n, bin: filepath.Join(cfg.BinDir, "rgserver"), status: status[i],
			logPath: filepath.Join(dir, n+".log"), args: []string{
				"--name", n, "--addr", s.rgsAddr[i], "--status-addr", status[i],
				"--data-dir", filepath.Join(dir, n), "--etcd-peer-addr", s.rgsPeer[i],
				"--etcd-initial-cluster", strings.Join(cluster, ","), "--log-level", "warn",
				"--persist-interval", cfg.PersistInterval.String(),
				"--budget-day-length", cfg.BudgetDayLength.String(),
				"--etcd-compaction-retention", cfg.CompactionRetention.String(),
				"--etcd-quota-backend-bytes", strconv.FormatInt(cfg.QuotaBytes, 10),
			}}
		if err := p.start(); err != nil {
			return s, err
		}
		s.rgs = append(s.rgs, p)
	}
	if addrErr != nil {
		return s, addrErr
	}
	for _, p := range s.rgs {
		if err := waitReady(p, 60*time.Second); err != nil {
			return s, err
		}
	}
	logf("rgserver ×3 ready: %s", strings.Join(s.rgsAddr, ","))

	for i := range 3 {
		n := fmt.Sprintf("rgproxy%d", i+1)
		a, st := addr(), addr()
		p := &proc{name: n, bin: filepath.Join(cfg.BinDir, "rgproxy"), status: st,
			logPath: filepath.Join(dir, n+".log"), args: []string{
				"--listen", a, "--status-addr", st, "--backend", s.mariaAdr,
				"--token-server", strings.Join(s.rgsAddr, ","), "--cache-dir", filepath.Join(dir, n+"-cache"),
				"--max-wait", cfg.MaxWait.String(), "--group-idle-expiry", cfg.GroupIdleExpiry.String(),
				"--log-level", "warn",
			}}
		if err := p.start(); err != nil {
			return s, err
		}
		s.pxs = append(s.pxs, p)
		s.pxAddr = append(s.pxAddr, a)
	}
	for _, p := range s.pxs {
		if err := waitReady(p, 30*time.Second); err != nil {
			return s, err
		}
	}
	logf("rgproxy ×3 ready: %s", strings.Join(s.pxAddr, ","))
	return s, addrErr
}

// stop ends every process (proxies first) and removes the directory
// unless keep.
func (s *system) stop(keep bool) {
	for _, p := range s.pxs {
		p.stop(syscall.SIGTERM, 10*time.Second)
	}
	for _, p := range s.rgs {
		p.stop(syscall.SIGTERM, 10*time.Second)
	}
	if s.maria != nil {
		s.maria.stop(syscall.SIGTERM, 30*time.Second)
	}
	if !keep {
		os.RemoveAll(s.dir)
	}
}

func mariadbdPath() string {
	for _, p := range []string{"/usr/sbin/mariadbd", "/usr/sbin/mysqld"} {
		if _, err := os.Stat(p); err == nil {
			return p
		}
	}
	return "mariadbd"
}

// waitMaria waits until the private server answers as root.
func (s *system) waitMaria(within time.Duration) error {
	deadline := time.Now().Add(within)
	for time.Now().Before(deadline) {
		if s.maria.exited() {
			return fmt.Errorf("mariadbd exited: %v (log %s)", s.maria.err, s.maria.logPath)
		}
		db, err := sql.Open("mysql", dsn(s.mariaAdr, "root", "", ""))
		if err == nil {
			err = db.Ping()
			db.Close()
			if err == nil {
				return nil
			}
		}
		time.Sleep(200 * time.Millisecond)
	}
	return fmt.Errorf("mariadbd not ready after %v (log %s)", within, s.maria.logPath)
}

// waitReady polls a process's /readyz until it answers 200.
func waitReady(p *proc, within time.Duration) error {
	deadline := time.Now().Add(within)
	for time.Now().Before(deadline) {
		if p.exited() {
			return fmt.Errorf("%s exited: %v (log %s)", p.name, p.err, p.logPath)
		}
		if resp, err := http.Get("http://" + p.status + "/readyz"); err == nil {
			resp.Body.Close()
			if resp.StatusCode == 200 {
				return nil
			}
		}
		time.Sleep(100 * time.Millisecond)
	}
	return fmt.Errorf("%s not ready after %v (log %s)", p.name, within, p.logPath)
}

func dsn(addr, user, pass, db string, params ...string) string {
	c := mysql.NewConfig()
	c.User, c.Passwd, c.Net, c.Addr, c.DBName = user, pass, "tcp", addr, db
	c.Timeout = 5 * time.Second
	for _, p := range params {
		if p == "interpolateParams" {
			c.InterpolateParams = true
		}
	}
	return c.FormatDSN()
}

// scrape returns a status port's metric families.
func scrape(statusAddr string) (map[string]*dto.MetricFamily, error) {
	c := http.Client{Timeout: 5 * time.Second}
	resp, err := c.Get("http://" + statusAddr + "/metrics")
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	p := expfmt.NewTextParser(model.UTF8Validation)
	return p.TextToMetricFamilies(resp.Body)
}

// sumMetric adds up the samples of a family whose labels include every
// pair in want (a histogram's sample count, a counter's or gauge's value).
func sumMetric(fams map[string]*dto.MetricFamily, name string, want map[string]string) (float64, bool) {
	f, ok := fams[name]
	if !ok {
		return 0, false
	}
	var sum float64
	found := false
	for _, m := range f.GetMetric() {
		match := true
		for k, v := range want {
			has := false
			for _, l := range m.GetLabel() {
				if l.GetName() == k && l.GetValue() == v {
					has = true
				}
			}
			match = match && has
		}
		if !match {
			continue
		}
		found = true
		switch {
		case m.GetCounter() != nil:
			sum += m.GetCounter().GetValue()
		case m.GetGauge() != nil:
			sum += m.GetGauge().GetValue()
		case m.GetUntyped() != nil:
			sum += m.GetUntyped().GetValue()
		case m.GetHistogram() != nil:
			sum += float64(m.GetHistogram().GetSampleCount())
		}
	}
	return sum, found
}

// groupsWithSeries returns the resource_group label values a scrape holds.
func groupsWithSeries(fams map[string]*dto.MetricFamily) map[string]bool {
	out := map[string]bool{}
	for _, f := range fams {
		for _, m := range f.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "resource_group" {
					out[l.GetValue()] = true
				}
			}
		}
	}
	return out
}

// procStats is what /proc (and /metrics) say about one process.
type procStats struct {
	PID        int
	RSSKiB     int64
	Threads    int
	FDs        int
	Goroutines float64 // -1: no /metrics
}

func statsOf(p *proc) (procStats, error) {
	st := procStats{PID: p.pid(), Goroutines: -1}
	if p.exited() {
		return st, fmt.Errorf("%s is not running", p.name)
	}
	f, err := os.Open(fmt.Sprintf("/proc/%d/status", st.PID))
	if err != nil {
		return st, err
	}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		k, v, _ := strings.Cut(sc.Text(), ":")
		fields := strings.Fields(v)
		if len(fields) == 0 {
			continue
		}
		switch k {
		case "VmRSS":
			st.RSSKiB, _ = strconv.ParseInt(fields[0], 10, 64)
		case "Threads":
			st.Threads, _ = strconv.Atoi(fields[0])
		}
	}
	f.Close()
	fds, err := os.ReadDir(fmt.Sprintf("/proc/%d/fd", st.PID))
	if err != nil {
		return st, err
	}
	st.FDs = len(fds)
	if p.status != "" {
		fams, err := scrape(p.status)
		if err != nil {
			return st, err
		}
		if g, ok := sumMetric(fams, "go_goroutines", nil); ok {
			st.Goroutines = g
		}
	}
	return st, nil
}

// etcdClientURL finds the client URL of the etcd member embedded in an
// rgserver: rgserver picks a free loopback port for it and has no flag to
// name one, so it is the process's one TCP listener that is not its gRPC,
// status or peer address (read from /proc/<pid>/fd and /proc/net/tcp).
func etcdClientURL(p *proc, known ...string) (string, error) {
	inodes := map[string]bool{}
	fds, err := os.ReadDir(fmt.Sprintf("/proc/%d/fd", p.pid()))
	if err != nil {
		return "", err
	}
	for _, fd := range fds {
		link, err := os.Readlink(fmt.Sprintf("/proc/%d/fd/%s", p.pid(), fd.Name()))
		if err == nil && strings.HasPrefix(link, "socket:[") {
			inodes[strings.TrimSuffix(strings.TrimPrefix(link, "socket:["), "]")] = true
		}
	}
	skip := map[int]bool{}
	for _, k := range known {
		k = strings.TrimPrefix(k, "http://")
		if _, port, err := net.SplitHostPort(k); err == nil {
			n, _ := strconv.Atoi(port)
			skip[n] = true
		}
	}
	f, err := os.Open(fmt.Sprintf("/proc/%d/net/tcp", p.pid()))
	if err != nil {
		return "", err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	var found []int
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		// sl local_address rem_address st tx:rx tr:when retrnsmt uid timeout inode
		if len(fields) < 10 || fields[3] != "0A" || !inodes[fields[9]] {
			continue
		}
		_, hexPort, _ := strings.Cut(fields[1], ":")
		b, err := hex.DecodeString(hexPort)
		if err != nil || len(b) != 2 {
			continue
		}
		if port := int(b[0])<<8 | int(b[1]); !skip[port] {
			found = append(found, port)
		}
	}
	if len(found) != 1 {
		return "", fmt.Errorf("%s: want one etcd client listener besides %v, found ports %v", p.name, known, found)
	}
	return fmt.Sprintf("http://127.0.0.1:%d", found[0]), nil
}

var errNoLeader = errors.New("no rgserver leads")

// leader returns the index of the replica whose rgserver_is_leader is 1.
func (s *system) leader(within time.Duration) (int, error) {
	deadline := time.Now().Add(within)
	for {
		for i, p := range s.rgs {
			if p.exited() {
				continue
			}
			fams, err := scrape(p.status)
			if err != nil {
				continue
			}
			if v, _ := sumMetric(fams, "rgserver_is_leader", nil); v == 1 {
				return i, nil
			}
		}
		if time.Now().After(deadline) {
			return -1, errNoLeader
		}
		time.Sleep(50 * time.Millisecond)
	}
}

#!/usr/bin/env python3
# Usage: cpu.py ROUNDS BASE.test NEW.test BASE_TIER2_DIR NEW_TIER2_DIR
import os, subprocess, sys, statistics, re, time
# Alternates base and new test binaries; per round measures CPU seconds
# (user+sys, from wait4) of -benchtime=N1x and N2x runs; CPU per request =
# (cpu(N2) - cpu(N1)) / (N2 - N1), which removes the set-up (keys, config).
# Also records the wall ns/op the benchmark prints at N2.
N1, N2 = 2000, 12000
rounds = int(sys.argv[1])
# argv[2], argv[3]: the base and new tier2 test binaries; argv[4], argv[5]: their tier2 source dirs.
bins = {'base': sys.argv[2], 'new': sys.argv[3]}
dirs = {sys.argv[2]: sys.argv[4], sys.argv[3]: sys.argv[5]}
def run(binary, n):
    p = subprocess.Popen([binary, '-test.run', '^$', '-test.bench', '^BenchmarkServeInference$', '-test.benchmem',
                          '-test.benchtime', f'{n}x', '-test.count', '1', '-test.cpu', '1'], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, cwd=dirs[binary])
    out = p.stdout.read().decode()
    _, status, ru = os.wait4(p.pid, 0)
    m = re.search(r'BenchmarkServeInference\S*\s+\d+\s+(\d+(?:\.\d+)?) ns/op\s+(\d+) B/op\s+(\d+) allocs/op', out)
    if not m:
        print(out); sys.exit(1)
    return ru.ru_utime + ru.ru_stime, float(m.group(1)), int(m.group(2)), int(m.group(3))
res = {'base': [], 'new': []}
for r in range(rounds):
    for name in (['base', 'new'] if r % 2 == 0 else ['new', 'base']):
        b = bins[name]
        c1, _, _, _ = run(b, N1)
        c2, ns, bop, allocs = run(b, N2)
        per = (c2 - c1) / (N2 - N1) * 1e6
        res[name].append((per, ns / 1000, bop, allocs))
        print(f'round {r+1} {name}: cpu {per:.1f} µs/req, wall {ns/1000:.1f} µs/op, {bop} B/op, {allocs} allocs/op', flush=True)
for name in res:
    cpus = [x[0] for x in res[name]]; walls = [x[1] for x in res[name]]
    print(f'{name}: median cpu {statistics.median(cpus):.1f} µs/req (runs {", ".join(f"{c:.1f}" for c in cpus)}); median wall {statistics.median(walls):.1f} µs/op; allocs {res[name][0][3]}, B/op {res[name][0][2]}')
mb = statistics.median([x[0] for x in res['base']]); mn = statistics.median([x[0] for x in res['new']])
wb = statistics.median([x[1] for x in res['base']]); wn = statistics.median([x[1] for x in res['new']])
print(f'new/base: cpu {mn/mb:.3f}, wall {wn/wb:.3f}')

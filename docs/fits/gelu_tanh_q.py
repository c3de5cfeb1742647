"""Fits GELU_TANH_Q in crates/compute-simd/src/simd/math.rs: q(v) = 1/(1 + e^v)
on 32 pieces v in [j - 1/2, j + 1/2], degree 6 in d = v - j, least squares of
relative error with Lawson reweighting. Pure Python (no numpy):
    python3 docs/fits/gelu_tanh_q.py > table.txt   (errors per piece on stderr)
The table was pasted with each coefficient written in its shortest f32 form."""
import math, struct
def f(v): return 1.0/(1.0+math.exp(v))
def f32(x): return struct.unpack('f', struct.pack('f', x))[0]
DEG=6
def solve(A,b):
    n=len(b); M=[row[:]+[b[i]] for i,row in enumerate(A)]
    for c in range(n):
        p=max(range(c,n),key=lambda r:abs(M[r][c])); M[c],M[p]=M[p],M[c]
        for r in range(n):
            if r!=c:
                fac=M[r][c]/M[c][c]
                for k in range(c,n+1): M[r][k]-=fac*M[c][k]
    return [M[i][n]/M[i][i] for i in range(n)]
tables=[[0.0]*32 for _ in range(DEG+1)]
worst=0
for j in range(32):
    # Lawson-weighted least squares of relative error on a dense grid over d in [-0.5,0.5]
    N=200
    ds=[0.5*math.cos(math.pi*(i+0.5)/N) for i in range(N)]
    w=[1.0]*N
    for it in range(30):
        A=[[0.0]*(DEG+1) for _ in range(DEG+1)]; b=[0.0]*(DEG+1)
        for d,wi in zip(ds,w):
            y=f(j+d); row=[d**k/y for k in range(DEG+1)]
            for r in range(DEG+1):
                b[r]+=wi*row[r]*1.0
                for c in range(DEG+1): A[r][c]+=wi*row[r]*row[c]
        c=solve(A,b)
        errs=[abs(sum(c[k]*d**k for k in range(DEG+1))/f(j+d)-1) for d in ds]
        s=sum(wi*e for wi,e in zip(w,errs))
        w=[wi*e/s for wi,e in zip(w,errs)]
    cf=[f32(x) for x in c]
    dense=[-0.5+i/2000 for i in range(2001)]
    e64=max(abs(sum(c[k]*d**k for k in range(DEG+1))/f(j+d)-1) for d in dense)
    e32=max(abs(sum(cf[k]*d**k for k in range(DEG+1))/f(j+d)-1) for d in dense)
    worst=max(worst,e64)
    for k in range(DEG+1): tables[k][j]=cf[k]
    print("piece",j,"rel err f64 %.2e, f32 coefs %.2e"%(e64,e32), file=__import__('sys').stderr)
print("// worst relative error before rounding: %.2e"%worst)
for k in range(DEG+1):
    print("    [")
    for j in range(32): print("        %s,"%repr(tables[k][j]))
    print("    ],")

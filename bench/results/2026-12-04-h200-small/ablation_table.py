# Median over rounds of each variant's plain-buffer medians: python3 ablation_table.py a0,lib,reorder,nohdrsum (run in a folder of abl_*.json)
import json,statistics as st,glob,sys
res={}
for f in glob.glob('abl_*.json'):
    _,v,n,i=f[:-5].split('_')
    d=json.load(open(f))
    for r in d['results']:
        if r['registered']: continue
        res.setdefault((int(n),r['bytes'],v),[]).append(r['median_us'])
vs=sys.argv[1].split(',')
print('n   bytes '+' '.join(f'{v:>11}' for v in vs))
for n in (2,3,4):
  for b in (1024,4096,16384,65536,262144):
    print(n,f'{b:7d}',' '.join(f'{st.median(res[(n,b,v)]):11.2f}' for v in vs))

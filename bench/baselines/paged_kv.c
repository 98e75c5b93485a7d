/* A paged KV cache read as a decoding step of 8 sequences reads it (issue 17's server):
 * 8 sequences x 30 layers x 3 KV heads, 256 positions each in blocks of 16 rows (a row:
 * 3 heads x 64 float16, a head's 128 bytes of every 384), blocks scattered in the pool
 * (47 MB of keys and values, past L3: from DRAM every step, as behind a model's
 * weights). Each head's keys then values, block by block: rows converted to float (as
 * braze_h2f_rows) and dotted. Mode 0 as braze read them before; mode D prefetches the
 * rows D blocks ahead (mode 1: the next block, as codegen/chain.py's blockwise does).
 *
 *   gcc -O3 -march=native bench/baselines/paged_kv.c -o /tmp/paged_kv && /tmp/paged_kv 0 && /tmp/paged_kv 1
 */
#include <immintrin.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#define H 3
#define D 64
#define BS 16
static double now(void){struct timespec t;clock_gettime(CLOCK_MONOTONIC,&t);return t.tv_sec*1e3+t.tv_nsec*1e-6;}
/* tasks: S seqs x L layers x H heads; each reads NB blocks of keys then values */
int main(int argc,char**argv){
  int S=8,L=30,NB=16; int mode=atoi(argv[1]);
  int nblocks=S*L*NB; size_t blk=(size_t)BS*H*D; /* halves per block */
  uint16_t *K=aligned_alloc(4096,nblocks*blk*2), *V=aligned_alloc(4096,nblocks*blk*2);
  for(size_t i=0;i<nblocks*blk;i++){K[i]=0x3c00+(i&255);V[i]=0x3c00+(i*7&255);}
  int *table=malloc(nblocks*sizeof(int)); for(int i=0;i<nblocks;i++)table[i]=i; 
  srand(1); for(int i=nblocks-1;i>0;i--){int j=rand()%(i+1);int t=table[i];table[i]=table[j];table[j]=t;}
  char *flush=malloc(128<<20); 
  float q[D]; for(int i=0;i<D;i++)q[i]=0.01f*i; float buf[BS*D]; float sc[BS*NB]; float out[D];
  double best=1e9, tot=0; int reps=15; volatile float sink=0;
  for(int rep=0;rep<reps;rep++){
    memset(flush,rep,128<<20);
    double t=now();
    for(int s=0;s<S;s++)for(int l=0;l<L;l++)for(int h=0;h<H;h++){
      const int *tb=table+(s*L+l)*NB;
      for(int pass=0;pass<2;pass++){ const uint16_t *P=pass?V:K;
        for(int b=0;b<NB;b++){
          const uint16_t *src=P+(size_t)tb[b]*blk+h*D;
          if(mode>=1){ int dist=mode; if(b==0) for(int a=0;a<dist&&a<NB;a++){ const char *nx=(const char*)(P+(size_t)tb[a]*blk+h*D); for(int r=0;r<BS;r++){__builtin_prefetch(nx+r*H*D*2,0,3);__builtin_prefetch(nx+r*H*D*2+64,0,3);} }
            if(b+dist<NB){ const char *nx=(const char*)(P+(size_t)tb[b+dist]*blk+h*D); for(int r=0;r<BS;r++){__builtin_prefetch(nx+r*H*D*2,0,3);__builtin_prefetch(nx+r*H*D*2+64,0,3);} } }
          for(int r=0;r<BS;r++) for(int i=0;i<D;i+=8) _mm256_storeu_ps(buf+r*D+i,_mm256_cvtph_ps(_mm_loadu_si128((const __m128i*)(src+r*H*D+i))));
          if(!pass) for(int r=0;r<BS;r++){float a=0;for(int i=0;i<D;i++)a+=buf[r*D+i]*q[i]; sc[b*BS+r]=a;}
          else for(int r=0;r<BS;r++){float w=sc[b*BS+r]; for(int i=0;i<D;i++)out[i]+=w*buf[r*D+i];}
        }
      }
    }
    t=now()-t; if(t<best)best=t; tot+=t; sink+=out[3];
  }
  double mb=2.0*S*L*H*NB*BS*D*2/1e6;
  printf("mode %d: best %.2f ms, mean %.2f ms, %.1f MB -> %.1f GB/s\n",mode,best,tot/reps,mb,mb/best);
}

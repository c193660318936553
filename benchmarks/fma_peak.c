// The FMA clock and peak, timed in this thread's CPU time (the machine is shared: wall time would count
// other processes' turns): (1) one dependent zmm FMA chain: 4 cycles per FMA (the latency on Intel since
// Skylake and on Zen 4/5), so GHz = 4 * FMAs / seconds; (2) 24 independent chains: FMAs per cycle.
#include <immintrin.h>
#include <stdio.h>
#include <time.h>
static double cpu(void){struct timespec t;clock_gettime(CLOCK_THREAD_CPUTIME_ID,&t);return t.tv_sec+t.tv_nsec*1e-9;}
#define N 100000000L
int main(void){
  __m512 x=_mm512_set1_ps(1.f), m=_mm512_set1_ps(0.999999f), c=_mm512_set1_ps(1e-7f);
  double t=cpu(); for(long i=0;i<N;i++) x=_mm512_fmadd_ps(x,m,c); t=cpu()-t;
  double ghz = 4.0*N/t/1e9;
  printf("dependent chain: %.3f s CPU for %ld FMAs -> %.2f GHz (4-cycle latency) [%g]\n", t, N, ghz, _mm512_reduce_add_ps(x));
  __m512 a[24]; for(int i=0;i<24;i++) a[i]=_mm512_set1_ps((float)i);
  long n=N/10; t=cpu();
  for(long i=0;i<n;i++){
#define F(k) a[k]=_mm512_fmadd_ps(a[k],m,c);
    F(0)F(1)F(2)F(3)F(4)F(5)F(6)F(7)F(8)F(9)F(10)F(11)F(12)F(13)F(14)F(15)F(16)F(17)F(18)F(19)F(20)F(21)F(22)F(23)
  }
  t=cpu()-t; float s=0; for(int i=0;i<24;i++) s+=_mm512_reduce_add_ps(a[i]);
  double fmas = n*24.0;
  printf("24 independent chains: %.1f GFLOP/s per core of CPU time, %.2f zmm FMAs per cycle [%g]\n", fmas*32/t/1e9, fmas/t/1e9/ghz, s);
  return 0;
}

// llama.cpp's per-token decoding latency, as bench/llm.py times braze's steps: a
// one-token prompt (BOS), 8 untimed steps, then N steps each timed alone (llama_process
// of one token plus reading its logits back; the greedy argmax outside the timing), on a
// fresh context per round; prints P50, P99, P99/P50 and tokens/s over the N steps, and
// at the end the P99/P50 of each position's median step over the rounds (as bench/llm.py
// prints braze's: the step's own steadiness, a VM's slow phases taken out).
// llama-bench reports only per-run means, so the spread of one token's latency needs this.
//
//   L=/work/peer/llama_cpp_python-0.3.36/vendor/llama.cpp
//   g++ -O2 -std=c++17 bench/baselines/llama_steps.cpp -I$L/include -I$L/ggml/include \
//       -L/work/peer/build/bin -lllama -lggml -lggml-base -Wl,-rpath,/work/peer/build/bin -o /tmp/llama_steps
//   /tmp/llama_steps MODEL.gguf THREADS [N=256] [ROUNDS=3]
#include "llama.h"
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <vector>
static void quiet(ggml_log_level, const char *, void *) {}
static double pct(const std::vector<double> &sorted, double q) {  // linear between ranks, as numpy's
    double k = q * (sorted.size() - 1); size_t f = (size_t)k; double c = k - f;
    return f + 1 < sorted.size() ? sorted[f] * (1 - c) + sorted[f + 1] * c : sorted[f];
}
static void set1(llama_batch_ext *b, llama_token t, llama_pos p) {
    llama_batch_ext_clear(b); int i = llama_batch_ext_add_token(b, 0, t); llama_batch_ext_set_pos(b, i, &p);
    llama_batch_ext_set_output_logits(b, 0, true);
}
int main(int argc, char **argv) {
    const char *path = argv[1]; int nt = atoi(argv[2]); int N = argc > 3 ? atoi(argv[3]) : 256; int R = argc > 4 ? atoi(argv[4]) : 3;
    int W = 8;
    llama_log_set(quiet, nullptr);
    llama_backend_init();
    llama_model *model = llama_model_load_from_file(path, llama_model_default_params());
    const llama_vocab *vocab = llama_model_get_vocab(model); int nv = llama_vocab_n_tokens(vocab);
    std::vector<std::vector<double>> rounds;
    for (int r = 0; r < R; r++) {
        llama_context_params cp = llama_context_default_params();
        cp.n_ctx = 1 + W + N + 16; cp.n_batch = 16; cp.n_threads = nt; cp.n_threads_batch = nt; cp.no_perf = true;
        llama_context *ctx = llama_init_from_model(model, cp);
        llama_batch_ext *b = llama_batch_ext_init(ctx);
        llama_token tok = llama_vocab_bos(vocab); std::vector<double> ms;
        for (int s = 0; s < 1 + W + N; s++) {
            set1(b, tok, s);
            auto t0 = std::chrono::steady_clock::now();
            if (llama_process(ctx, LLAMA_PROCESS_TYPE_DECODE, b)) { fprintf(stderr, "decode failed\n"); return 1; }
            const float *lg = llama_get_logits_ith(ctx, -1);
            auto t1 = std::chrono::steady_clock::now();
            tok = (llama_token)(std::max_element(lg, lg + nv) - lg);
            if (s > W) ms.push_back(std::chrono::duration<double, std::milli>(t1 - t0).count());
        }
        double tot = 0; for (double x : ms) tot += x;
        std::vector<double> s = ms; std::sort(s.begin(), s.end());
        printf("llama.cpp threads=%d round %d: steps %zu P50 %.3f P99 %.3f ratio %.3f max %.3f mean %.3f tok/s %.1f\n", nt, r, s.size(), pct(s, .5), pct(s, .99), pct(s, .99) / pct(s, .5), s.back(), tot / s.size(), 1000.0 * s.size() / tot);
        rounds.push_back(ms);
        llama_batch_ext_free(b); llama_free(ctx);
    }
    std::vector<double> med;  // each position's median over the rounds
    for (size_t i = 0; i < rounds[0].size(); i++) {
        std::vector<double> v; for (auto &ms : rounds) v.push_back(ms[i]);
        std::sort(v.begin(), v.end()); med.push_back(pct(v, .5));
    }
    std::sort(med.begin(), med.end());
    printf("llama.cpp threads=%d, each position's median over %d rounds: P50 %.3f P99 %.3f ratio %.3f\n", nt, R, pct(med, .5), pct(med, .99), pct(med, .99) / pct(med, .5));
    llama_model_free(model);
}

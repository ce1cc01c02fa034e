//! Matrix products as the workloads state them (row-major, densely stored operands, either one
//! possibly transposed) and as cuBLAS takes them (column-major).
//!
//! A row-major matrix read column-major is its transpose, so the row-major C = op(A)·op(B) is
//! the column-major C′ = op(B)′·op(A)′: cuBLAS gets B as its first operand and A as its second,
//! with the dimensions swapped. [`Gemm::cublas`] is the one place that mapping is written; the
//! MLP's layers and the transformer replay both call cuBLAS through it.

/// C (m × n) = op(A) (m × k) · op(B) (k × n), `batch` times. A is stored m × k, or k × m when
/// `a_transposed`; B is stored k × n, or n × k when `b_transposed`; C is stored m × n. Storage is
/// dense and row-major.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Gemm {
    pub m: usize,
    pub n: usize,
    pub k: usize,
    pub batch: usize,
    pub a_transposed: bool,
    pub b_transposed: bool,
}

/// The arguments of cuBLAS's `gemm` (`cublasSgemm`, `cublasGemmStridedBatchedEx`) that compute
/// a [`Gemm`]: `gemm(transa, transb, m, n, k, α, B, lda, A, ldb, β, C, ldc)`. The names are
/// cuBLAS's, so its "A" is the row-major product's B and its "B" is the product's A.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CublasGemm {
    pub transa: bool,
    pub transb: bool,
    pub m: usize,
    pub n: usize,
    pub k: usize,
    pub lda: usize,
    pub ldb: usize,
    pub ldc: usize,
}

impl Gemm {
    /// One product with neither operand transposed.
    pub fn new(m: usize, n: usize, k: usize) -> Self {
        Gemm {
            m,
            n,
            k,
            batch: 1,
            a_transposed: false,
            b_transposed: false,
        }
    }

    /// A linear layer's forward product with the weight stored as frameworks store it:
    /// y (rows × outputs) = x (rows × inputs) · Wᵀ, W stored outputs × inputs.
    pub fn linear(rows: usize, inputs: usize, outputs: usize) -> Self {
        Gemm::new(rows, outputs, inputs).b_transposed()
    }

    pub fn batched(self, batch: usize) -> Self {
        Gemm { batch, ..self }
    }

    pub fn a_transposed(self) -> Self {
        Gemm {
            a_transposed: true,
            ..self
        }
    }

    pub fn b_transposed(self) -> Self {
        Gemm {
            b_transposed: true,
            ..self
        }
    }

    pub fn flops(&self) -> f64 {
        2.0 * (self.m * self.n * self.k * self.batch) as f64
    }

    /// Elements of A, B and C of one product of the batch.
    pub fn elements(&self) -> (usize, usize, usize) {
        (self.m * self.k, self.k * self.n, self.m * self.n)
    }

    /// The column-major call: C′ (n × m) = op(B)′ (n × k) · op(A)′ (k × m). A stored row-major
    /// with r rows and c columns is, read column-major, c × r with leading dimension c; so the
    /// leading dimensions are the stored row widths, and a transposed operand stays transposed.
    pub fn cublas(&self) -> CublasGemm {
        CublasGemm {
            transa: self.b_transposed,
            transb: self.a_transposed,
            m: self.n,
            n: self.m,
            k: self.k,
            lda: if self.b_transposed { self.k } else { self.n },
            ldb: if self.a_transposed { self.m } else { self.k },
            ldc: self.n,
        }
    }

    /// Computes C ← α·op(A)·op(B) + β·C on the host (fp32, `matrixmultiply`), with the strides
    /// the storage above implies. One product (`batch` = 1); the slices must hold at least the
    /// operands' elements.
    pub fn host(&self, alpha: f32, a: &[f32], b: &[f32], beta: f32, c: &mut [f32]) {
        let (m, n, k) = (self.m, self.n, self.k);
        assert_eq!(self.batch, 1, "a host product is not batched");
        let (a_len, b_len, c_len) = self.elements();
        assert!(
            a.len() >= a_len && b.len() >= b_len && c.len() >= c_len,
            "operands of {}, {} and {} elements for a {m}×{n}×{k} product",
            a.len(),
            b.len(),
            c.len()
        );
        let (rsa, csa) = if self.a_transposed { (1, m) } else { (k, 1) };
        let (rsb, csb) = if self.b_transposed { (1, k) } else { (n, 1) };
        // SAFETY: the lengths are asserted above; with these strides every index of op(A)
        // (m × k), op(B) (k × n) and C (m × n) lies inside its dense row-major storage.
        unsafe {
            matrixmultiply::sgemm(
                m,
                k,
                n,
                alpha,
                a.as_ptr(),
                rsa as isize,
                csa as isize,
                b.as_ptr(),
                rsb as isize,
                csb as isize,
                beta,
                c.as_mut_ptr(),
                n as isize,
                1,
            );
        }
    }

    /// The two backward products of C = op(A)·op(B) given dC, each written into the operand's
    /// own storage: dA = dC·op(B)ᵀ (or op(B)·dCᵀ when A is stored transposed) and
    /// dB = op(A)ᵀ·dC (or dCᵀ·op(A) when B is stored transposed). Each costs the forward FLOPs.
    pub fn backward(&self) -> [Gemm; 2] {
        let (m, n, k, batch) = (self.m, self.n, self.k, self.batch);
        let product = |m, n, k, a_transposed, b_transposed| Gemm {
            m,
            n,
            k,
            batch,
            a_transposed,
            b_transposed,
        };
        let input_grad = if self.a_transposed {
            product(k, m, n, self.b_transposed, true)
        } else {
            product(m, k, n, false, !self.b_transposed)
        };
        let weight_grad = if self.b_transposed {
            product(n, k, m, true, self.a_transposed)
        } else {
            product(k, n, m, !self.a_transposed, false)
        };
        [input_grad, weight_grad]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// cuBLAS's column-major `gemm` as the BLAS reference defines it (C = α·op(A)·op(B) + β·C,
    /// element (i, j) of a matrix with leading dimension ld at i + j·ld), including its argument
    /// checks: a call that fails them would return CUBLAS_STATUS_INVALID_VALUE on a GPU.
    fn blas_gemm(call: &CublasGemm, a: &[f32], b: &[f32], beta: f32, c: &mut [f32]) {
        let CublasGemm {
            transa,
            transb,
            m,
            n,
            k,
            lda,
            ldb,
            ldc,
        } = *call;
        assert!(lda >= (if transa { k } else { m }).max(1), "lda {call:?}");
        assert!(ldb >= (if transb { n } else { k }).max(1), "ldb {call:?}");
        assert!(ldc >= m.max(1), "ldc {call:?}");
        let op_a = |i: usize, l: usize| {
            if transa {
                a[l + i * lda]
            } else {
                a[i + l * lda]
            }
        };
        let op_b = |l: usize, j: usize| {
            if transb {
                b[j + l * ldb]
            } else {
                b[l + j * ldb]
            }
        };
        for j in 0..n {
            for i in 0..m {
                let sum: f32 = (0..k).map(|l| op_a(i, l) * op_b(l, j)).sum();
                c[i + j * ldc] = sum + beta * c[i + j * ldc];
            }
        }
    }

    /// Row-major op(X)(i, j) of a densely stored operand with `rows` × `cols` after op.
    fn element(x: &[f32], transposed: bool, cols: usize, rows: usize, i: usize, j: usize) -> f32 {
        if transposed {
            x[j * rows + i]
        } else {
            x[i * cols + j]
        }
    }

    /// The row-major product, written out.
    fn row_major(g: &Gemm, a: &[f32], b: &[f32]) -> Vec<f32> {
        let mut c = vec![0.0; g.m * g.n];
        for i in 0..g.m {
            for j in 0..g.n {
                c[i * g.n + j] = (0..g.k)
                    .map(|l| {
                        element(a, g.a_transposed, g.k, g.m, i, l)
                            * element(b, g.b_transposed, g.n, g.k, l, j)
                    })
                    .sum();
            }
        }
        c
    }

    /// `len` deterministic values in [−0.5, 0.5) (the MLP's generator).
    fn values(len: usize, seed: u64) -> Vec<f32> {
        (0..len as u64)
            .map(|i| 0.5 * crate::mlp::uniform(seed, i, 0))
            .collect()
    }

    fn all_layouts(m: usize, n: usize, k: usize) -> Vec<Gemm> {
        let plain = Gemm::new(m, n, k);
        vec![
            plain,
            plain.a_transposed(),
            plain.b_transposed(),
            plain.a_transposed().b_transposed(),
        ]
    }

    /// For every transpose combination and non-square shapes, the cuBLAS call that `cublas`
    /// describes computes the row-major product (and passes cuBLAS's argument checks).
    #[test]
    fn the_column_major_call_computes_the_row_major_product() {
        for (m, n, k) in [(3, 5, 7), (7, 2, 4), (1, 6, 3), (5, 5, 1)] {
            for g in all_layouts(m, n, k) {
                let (ea, eb, ec) = g.elements();
                let (a, b) = (values(ea, 1), values(eb, 2));
                let expected = row_major(&g, &a, &b);
                let mut c = vec![0.0; ec];
                blas_gemm(&g.cublas(), &b, &a, 0.0, &mut c);
                for (x, y) in c.iter().zip(&expected) {
                    assert!((x - y).abs() <= 1e-5, "{g:?}: {c:?} vs {expected:?}");
                }
            }
        }
    }

    /// The backward products are the gradients of L = ⟨dC, op(A)·op(B)⟩: for random
    /// perturbations, ⟨dA, ΔA⟩ = ⟨dC, op(ΔA)·op(B)⟩ and ⟨dB, ΔB⟩ = ⟨dC, op(A)·op(ΔB)⟩, with dA
    /// and dB computed by the products `backward` returns on the operands their doc names.
    #[test]
    fn backward_products_are_the_gradients() {
        let dot = |x: &[f32], y: &[f32]| x.iter().zip(y).map(|(a, b)| a * b).sum::<f32>();
        for (m, n, k) in [(3, 5, 7), (6, 2, 4)] {
            for g in all_layouts(m, n, k) {
                let (ea, eb, ec) = g.elements();
                let (a, b, dc) = (values(ea, 3), values(eb, 4), values(ec, 5));
                let (delta_a, delta_b) = (values(ea, 6), values(eb, 7));
                let [input_grad, weight_grad] = g.backward();
                let da = if g.a_transposed {
                    row_major(&input_grad, &b, &dc)
                } else {
                    row_major(&input_grad, &dc, &b)
                };
                let db = if g.b_transposed {
                    row_major(&weight_grad, &dc, &a)
                } else {
                    row_major(&weight_grad, &a, &dc)
                };
                let along_a = dot(&dc, &row_major(&g, &delta_a, &b));
                let along_b = dot(&dc, &row_major(&g, &a, &delta_b));
                assert!((dot(&da, &delta_a) - along_a).abs() < 1e-4, "dA of {g:?}");
                assert!((dot(&db, &delta_b) - along_b).abs() < 1e-4, "dB of {g:?}");
                for grad in [input_grad, weight_grad] {
                    assert_eq!(grad.flops(), g.flops());
                }
            }
        }
    }

    /// The CUDA backend's layer products (`Gemm::linear` and its backward, on the operands
    /// `backward` names) through cuBLAS's column-major call equal the CPU backend's layer.
    #[test]
    fn cublas_layer_products_equal_the_cpu_layer() {
        use crate::mlp::{linear_backward, linear_forward};
        let close = |x: &[f32], y: &[f32], what: &str| {
            for (a, b) in x.iter().zip(y) {
                assert!((a - b).abs() <= 1e-5, "{what}: {x:?} vs {y:?}");
            }
        };
        let (rows, din, dout) = (5, 3, 4);
        let (x, params, dz) = (
            values(rows * din, 8),
            values(dout * din + dout, 9),
            values(rows * dout, 10),
        );
        let (w, bias) = params.split_at(dout * din);
        let mut expected = vec![0.0; rows * dout];
        linear_forward(&x, &params, &mut expected, rows, (din, dout), false);
        let forward = Gemm::linear(rows, din, dout);
        let mut out: Vec<f32> = (0..rows).flat_map(|_| bias.iter().copied()).collect();
        blas_gemm(&forward.cublas(), w, &x, 1.0, &mut out);
        close(&out, &expected, "forward");

        let (mut grad_out, mut grads, mut grad_in) =
            (dz.clone(), vec![0.0; params.len()], vec![0.0; rows * din]);
        let output = vec![1.0; rows * dout];
        linear_backward(
            &x,
            &params,
            &output,
            &mut grad_out,
            &mut grads,
            Some(&mut grad_in),
            rows,
            (din, dout),
            false,
        );
        let [input_grad, weight_grad] = forward.backward();
        let mut dx = vec![0.0; rows * din];
        blas_gemm(&input_grad.cublas(), w, &dz, 0.0, &mut dx);
        close(&dx, &grad_in, "input gradient");
        let mut dw = vec![0.0; dout * din];
        blas_gemm(&weight_grad.cublas(), &x, &dz, 0.0, &mut dw);
        close(&dw, &grads[..dout * din], "weight gradient");
    }
}

//! Matrix products as the workloads state them (row-major operands, either one possibly
//! transposed, densely stored or with row and batch strides) and as cuBLAS takes them
//! (column-major).
//!
//! A row-major matrix read column-major is its transpose, so the row-major C = op(A)·op(B) is
//! the column-major C′ = op(B)′·op(A)′: cuBLAS gets B as its first operand and A as its second,
//! with the dimensions swapped. [`Strided::cublas`] is the one place that mapping is written; the
//! MLP's layers, GPT-2's products and the transformer replay all call cuBLAS through it.

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

/// How a product reads an operand: as stored, or transposed (the former `transposed: bool`'s
/// `true`; [`Gemm::a_transposed`] sets it on the first operand).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Orientation {
    AsStored,
    Transposed,
}

/// The arguments of cuBLAS's `gemm` (`cublasSgemm`, `cublasSgemmStridedBatched`,
/// `cublasGemmStridedBatchedEx`) that compute a [`Strided`] product:
/// `gemm(transa, transb, m, n, k, α, B, lda, strideA, A, ldb, strideB, β, C, ldc, strideC, batch)`.
/// The names are cuBLAS's, so its "A" is the row-major product's B and its "B" is the product's A.
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
    pub stride_a: usize,
    pub stride_b: usize,
    pub stride_c: usize,
    pub batch: usize,
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

    /// Rows and columns of A, B and C as stored.
    fn stored(&self) -> [(usize, usize); 3] {
        let (m, n, k) = (self.m, self.n, self.k);
        [
            if self.a_transposed { (k, m) } else { (m, k) },
            if self.b_transposed { (n, k) } else { (k, n) },
            (m, n),
        ]
    }

    /// The product on densely stored operands: each row stride is its stored row's width, each
    /// batch stride its operand's elements.
    pub fn dense(self) -> Strided {
        let (a, b, c) = self.elements();
        Strided {
            gemm: self,
            row_stride: self.stored().map(|(_, cols)| cols),
            batch_stride: [a, b, c],
        }
    }

    /// The product on operands stored with `row_stride` (elements from one stored row to the
    /// next) and `batch_stride` (from one product's operand to the next), each for A, B, C.
    /// Panics if a row stride is shorter than its stored row: a layout error in the caller.
    pub fn strided(self, row_stride: [usize; 3], batch_stride: [usize; 3]) -> Strided {
        for (operand, ((_, cols), stride)) in self.stored().iter().zip(row_stride).enumerate() {
            assert!(
                stride >= *cols,
                "operand {operand} of {self:?}: row stride {stride} below its {cols} columns"
            );
        }
        Strided {
            gemm: self,
            row_stride,
            batch_stride,
        }
    }

    /// The column-major call on dense operands ([`Strided::cublas`]).
    pub fn cublas(&self) -> CublasGemm {
        self.dense().cublas()
    }

    /// Computes C ← α·op(A)·op(B) + β·C on the host on dense operands ([`Strided::host`]).
    pub fn host(&self, alpha: f32, a: &[f32], b: &[f32], beta: f32, c: &mut [f32]) {
        self.dense().host(alpha, a, b, beta, c);
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

/// A [`Gemm`] on operands stored row-major with row and batch strides of their own (attention
/// reads Q, K and V out of the fused QKV rows): built by [`Gemm::dense`] or [`Gemm::strided`],
/// so every row stride covers its stored row.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Strided {
    gemm: Gemm,
    row_stride: [usize; 3],
    batch_stride: [usize; 3],
}

impl Strided {
    /// The product's shape.
    pub fn gemm(&self) -> &Gemm {
        &self.gemm
    }

    /// Elements of A, B and C from each operand's first element to its last, over the batch
    /// (0 for an empty operand).
    pub fn extents(&self) -> [usize; 3] {
        let batch = self.gemm.batch;
        let mut spans = [0; 3];
        for (i, (rows, cols)) in self.gemm.stored().into_iter().enumerate() {
            if batch > 0 && rows > 0 && cols > 0 {
                spans[i] =
                    (batch - 1) * self.batch_stride[i] + (rows - 1) * self.row_stride[i] + cols;
            }
        }
        spans
    }

    /// The column-major call: C′ (n × m) = op(B)′ (n × k) · op(A)′ (k × m). A stored row-major
    /// with row stride s is, read column-major, its transpose with leading dimension s; so the
    /// leading dimensions are the row strides, and a transposed operand stays transposed.
    pub fn cublas(&self) -> CublasGemm {
        let g = &self.gemm;
        let [a, b, c] = self.row_stride;
        let [stride_a, stride_b, stride_c] = self.batch_stride;
        CublasGemm {
            transa: g.b_transposed,
            transb: g.a_transposed,
            m: g.n,
            n: g.m,
            k: g.k,
            lda: b,
            ldb: a,
            ldc: c,
            stride_a: stride_b,
            stride_b: stride_a,
            stride_c,
            batch: g.batch,
        }
    }

    /// Computes C ← α·op(A)·op(B) + β·C on the host (fp32, `matrixmultiply`) for every product
    /// of the batch; the slices must hold the operands' [`Strided::extents`].
    pub fn host(&self, alpha: f32, a: &[f32], b: &[f32], beta: f32, c: &mut [f32]) {
        let Gemm { m, n, k, batch, .. } = self.gemm;
        let [ea, eb, ec] = self.extents();
        assert!(
            a.len() >= ea && b.len() >= eb && c.len() >= ec,
            "operands of {}, {} and {} elements for {self:?}",
            a.len(),
            b.len(),
            c.len()
        );
        let [ra, rb, rc] = self.row_stride;
        let (rsa, csa) = if self.gemm.a_transposed {
            (1, ra)
        } else {
            (ra, 1)
        };
        let (rsb, csb) = if self.gemm.b_transposed {
            (1, rb)
        } else {
            (rb, 1)
        };
        let [sa, sb, sc] = self.batch_stride;
        for i in 0..batch {
            // SAFETY: the extents are asserted above; with these strides every index of op(A)
            // (m × k), op(B) (k × n) and C (m × n) of product i lies inside its operand's extent.
            unsafe {
                matrixmultiply::sgemm(
                    m,
                    k,
                    n,
                    alpha,
                    a.as_ptr().add(i * sa),
                    rsa as isize,
                    csa as isize,
                    b.as_ptr().add(i * sb),
                    rsb as isize,
                    csb as isize,
                    beta,
                    c.as_mut_ptr().add(i * sc),
                    rc as isize,
                    1,
                );
            }
        }
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
            ..
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
        use crate::mlp::{Activation, linear_backward, linear_forward};
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
        linear_forward(
            &x,
            &params,
            &mut expected,
            rows,
            (din, dout),
            Activation::Identity,
        );
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
            Activation::Identity,
        );
        let [input_grad, weight_grad] = forward.backward();
        let mut dx = vec![0.0; rows * din];
        blas_gemm(&input_grad.cublas(), w, &dz, 0.0, &mut dx);
        close(&dx, &grad_in, "input gradient");
        let mut dw = vec![0.0; dout * din];
        blas_gemm(&weight_grad.cublas(), &x, &dz, 0.0, &mut dw);
        close(&dw, &grads[..dout * din], "weight gradient");
    }

    /// Attention's products read Q, K and V in place out of fused QKV rows: for every transpose
    /// combination, the strided product on the host and the cuBLAS call it describes (one call
    /// per product of the batch, at its batch offsets) equal the row-major product of dense
    /// copies of the operands.
    #[test]
    fn strided_products_read_their_operands_in_place() {
        let (m, n, k, batch) = (4, 3, 5, 3);
        for g in all_layouts(m, n, k) {
            let g = g.batched(batch);
            let stored = g.stored();
            // Each operand lives in a buffer with wider rows (+2) and a gap between products.
            let row_stride = stored.map(|(_, cols)| cols + 2);
            let batch_stride = [0, 1, 2].map(|i| stored[i].0 * row_stride[i] + 3);
            let strided = g.strided(row_stride, batch_stride);
            let [ea, eb, ec] = strided.extents();
            let (a, b) = (values(ea, 11), values(eb, 12));
            let c0 = values(ec, 13);
            let dense = |x: &[f32], i: usize, p: usize| -> Vec<f32> {
                let (rows, cols) = stored[i];
                (0..rows)
                    .flat_map(|r| {
                        let at = p * batch_stride[i] + r * row_stride[i];
                        x[at..at + cols].to_vec()
                    })
                    .collect()
            };
            let mut host = c0.clone();
            strided.host(1.0, &a, &b, 0.5, &mut host);
            let call = strided.cublas();
            assert_eq!(
                (call.stride_a, call.stride_b, call.stride_c, call.batch),
                (batch_stride[1], batch_stride[0], batch_stride[2], batch)
            );
            let mut blas = c0.clone();
            for p in 0..batch {
                let (sa, sb, sc) = (p * call.stride_a, p * call.stride_b, p * call.stride_c);
                blas_gemm(&call, &b[sa..], &a[sb..], 0.5, &mut blas[sc..]);
            }
            let single = Gemm { batch: 1, ..g };
            for p in 0..batch {
                let product = row_major(&single, &dense(&a, 0, p), &dense(&b, 1, p));
                let before = dense(&c0, 2, p);
                for (what, c) in [("host", &host), ("cuBLAS", &blas)] {
                    for (j, got) in dense(c, 2, p).iter().enumerate() {
                        let want = product[j] + 0.5 * before[j];
                        assert!((got - want).abs() <= 1e-5, "{what} {g:?} product {p}");
                    }
                }
            }
            // What lies between the rows and products is untouched.
            let written: std::collections::HashSet<usize> = (0..batch)
                .flat_map(|p| {
                    (0..m).flat_map(move |r| {
                        let at = p * batch_stride[2] + r * row_stride[2];
                        at..at + n
                    })
                })
                .collect();
            for i in (0..ec).filter(|i| !written.contains(i)) {
                assert_eq!((host[i], blas[i]), (c0[i], c0[i]), "{g:?} element {i}");
            }
        }
    }
}

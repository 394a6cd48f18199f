//! Goodness-of-fit arithmetic for the live tests: Pearson's chi-squared statistic, its
//! asymptotic p-value, and an exact-in-the-limit Monte Carlo p-value for small cells.
//!
//! Written out here (about 80 lines) rather than pulled from a statistics crate, whose
//! dependency tree would dwarf the tests; `abuse.rs` checks it against table values.

use rand_core::{RngCore, SeedableRng};
use rand_xoshiro::Xoshiro256PlusPlus;

/// Pearson's statistic: the sum over cells of (observed - expected)^2 / expected.
pub fn chi_squared(observed: &[u64], expected: &[f64]) -> f64 {
    assert_eq!(observed.len(), expected.len());
    observed
        .iter()
        .zip(expected)
        .map(|(&o, &e)| (o as f64 - e).powi(2) / e)
        .sum()
}

/// P(X >= x) for X chi-squared with `dof` degrees of freedom: the regularized upper
/// incomplete gamma function Q(dof/2, x/2).
pub fn chi_squared_sf(x: f64, dof: u32) -> f64 {
    upper_gamma_regularized(f64::from(dof) / 2.0, x / 2.0)
}

/// ln Γ(x) for x > 0 (Lanczos, g = 7, 9 terms: about 15 significant digits).
pub fn ln_gamma(x: f64) -> f64 {
    const G: f64 = 7.0;
    const C: [f64; 9] = [
        0.999_999_999_999_809_9,
        676.520_368_121_885_1,
        -1_259.139_216_722_402_8,
        771.323_428_777_653_1,
        -176.615_029_162_140_6,
        12.507_343_278_686_905,
        -0.138_571_095_265_720_12,
        9.984_369_578_019_572e-6,
        1.505_632_735_149_311_6e-7,
    ];
    if x < 0.5 {
        // Reflection keeps the series in its accurate range.
        let pi = std::f64::consts::PI;
        return (pi / (pi * x).sin()).ln() - ln_gamma(1.0 - x);
    }
    let x = x - 1.0;
    let t = x + G + 0.5;
    let series = C[1..]
        .iter()
        .enumerate()
        .fold(C[0], |sum, (i, c)| sum + c / (x + i as f64 + 1.0));
    0.5 * (2.0 * std::f64::consts::PI).ln() + (x + 0.5) * t.ln() - t + series.ln()
}

/// Q(a, x) = Γ(a, x) / Γ(a): the series for P below a + 1, Lentz's continued fraction
/// above (each converges fast on its side).
fn upper_gamma_regularized(a: f64, x: f64) -> f64 {
    if x <= 0.0 {
        return 1.0;
    }
    let log_prefactor = a * x.ln() - x - ln_gamma(a);
    if x < a + 1.0 {
        let (mut term, mut sum, mut n) = (1.0 / a, 1.0 / a, a);
        while term.abs() > sum.abs() * 1e-16 {
            n += 1.0;
            term *= x / n;
            sum += term;
        }
        return (1.0 - sum * log_prefactor.exp()).max(0.0);
    }
    let tiny = 1e-300;
    let mut b = x + 1.0 - a;
    let mut c = 1.0 / tiny;
    let mut d = 1.0 / b;
    let mut h = d;
    for i in 1..10_000 {
        let an = -(i as f64) * (i as f64 - a);
        b += 2.0;
        d = an * d + b;
        d = if d.abs() < tiny { tiny } else { d };
        c = b + an / c;
        c = if c.abs() < tiny { tiny } else { c };
        d = 1.0 / d;
        let step = d * c;
        h *= step;
        if (step - 1.0).abs() < 1e-16 {
            break;
        }
    }
    log_prefactor.exp() * h
}

/// The p-value of Pearson's statistic for `observed` against a multinomial with cell
/// probabilities `probabilities`, by simulation: the fraction of `replicates` multinomial
/// draws (with the observed total) whose statistic is at least the observed one, counting
/// the observation itself. Valid however small the expected counts, where the chi-squared
/// approximation is not; deterministic for a given `seed`.
pub fn monte_carlo_p_value(
    observed: &[u64],
    probabilities: &[f64],
    replicates: u32,
    seed: u64,
) -> f64 {
    let total: u64 = observed.iter().sum();
    let expected: Vec<f64> = probabilities.iter().map(|p| p * total as f64).collect();
    let statistic = chi_squared(observed, &expected);
    let mut rng = Xoshiro256PlusPlus::seed_from_u64(seed);
    let mut at_least = 0u32;
    let mut draw = vec![0u64; observed.len()];
    for _ in 0..replicates {
        // Cell by cell: each is binomial given what the cells before it took.
        let (mut left, mut mass_left) = (total, 1.0);
        for (cell, &p) in draw.iter_mut().zip(probabilities) {
            let share = if mass_left > 0.0 {
                (p / mass_left).min(1.0)
            } else {
                1.0
            };
            *cell = binomial(&mut rng, left, share);
            left -= *cell;
            mass_left -= p;
        }
        // Floating point may leave a remainder; it belongs to the last cell.
        *draw.last_mut().unwrap() += left;
        if chi_squared(&draw, &expected) >= statistic - 1e-9 {
            at_least += 1;
        }
    }
    f64::from(at_least + 1) / f64::from(replicates + 1)
}

/// A Binomial(n, p) draw by inversion, counting from whichever tail is lighter. Inversion
/// starts at P(0) = (1 - p)^n, which underflows for large means, so a large draw is the sum
/// of draws over slices of n with a mean of at most 400 each (a sum of binomials with the
/// same p is binomial). The cost is O(n p), fine for the counts the tests simulate.
fn binomial(rng: &mut Xoshiro256PlusPlus, n: u64, p: f64) -> u64 {
    if p <= 0.0 || n == 0 {
        return 0;
    }
    if p >= 1.0 {
        return n;
    }
    if p > 0.5 {
        return n - binomial(rng, n, 1.0 - p);
    }
    let slices = (n as f64 * p / 400.0).ceil() as u64;
    if slices > 1 {
        let size = n.div_ceil(slices);
        return (0..n)
            .step_by(size as usize)
            .map(|start| binomial(rng, size.min(n - start), p))
            .sum();
    }
    let u = (rng.next_u64() >> 11) as f64 / (1u64 << 53) as f64;
    let ratio = p / (1.0 - p);
    let mut pmf = (n as f64 * (1.0 - p).ln()).exp();
    let mut cdf = pmf;
    let mut k = 0u64;
    while u > cdf && k < n {
        pmf *= ratio * (n - k) as f64 / (k + 1) as f64;
        k += 1;
        cdf += pmf;
        if pmf == 0.0 {
            // Rounding left the cdf a hair below u, far out in the tail: stop there.
            break;
        }
    }
    k
}

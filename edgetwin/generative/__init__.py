"""GAN-SMMSG and its baselines (GMM, plain GAN, WGAN-GP): who shows up."""

"""An image classifier from HF transformers (ResNet, random init) on synthetic images."""
